//! A training run: [`train`] loads `--init` or `--resume` and `--data`, writes `--save-data`,
//! runs the steps on one fixed batch or over a data set, evaluates, writes checkpoints, the
//! report, `--save` and the last checkpoint, and tells an [`Observer`] what happens (each step,
//! evaluation and epoch, and the run's summary). It prints nothing: the `ingot` command line's
//! observer prints the lines, the progress bar and the JSON, and maps a [`RunError`] to an exit
//! code.
//!
//! A data set is read batch by batch over epochs by a loader thread that fills the next batch
//! into one of two staging buffers (page-locked on the GPU) while the current step runs, each
//! batch copied straight into the input's planned slot ([`Session::step_on`]): nothing is
//! allocated per step. What the run keeps of its steps is of fixed size ([`crate::record`]), so
//! its host memory is flat however many steps it runs (`tests/flat_host_memory.rs`).
//!
//! `steps` and `epochs` are the run's totals counted from its start: a run resumed from a
//! checkpoint goes on from the checkpoint's step and position in the data to the same end. On
//! the CPU its losses are the uninterrupted run's, bit for bit.

use crate::checkpoint::{self, CheckpointInfo};
use crate::data::{BatchInfo, BatchSource, Epochs, Loader, Order, Staging};
use crate::datasets;
use crate::eval::Evaluator;
use crate::gpt_names;
use crate::record::StepTimes;
use crate::report::RunRecord;
use crate::schedule::{Decay, Schedule};
use crate::session::{self, Session, SessionError, StepResult};
use crate::state_dict::StateDict;
use indexmap::IndexMap;
use ingot_compiler::ir::NodeId;
use ingot_runtime::cuda::CudaStep;
use ingot_runtime::io;
use ingot_runtime::tensor::Tensor;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod error;
mod summary;
pub use error::{ObserverError, RunError};
use summary::free_on_gpus;
pub use summary::{planned_total, Finished, Summary};

/// How a run goes: what `ingot train` and `ingot run` take from their flags.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Steps, counted from the run's start. With a data set, `steps`, `epochs` or both (the run
    /// ends at whichever comes first).
    pub steps: Option<u64>,
    /// With a data set: passes over it, counted from the run's start.
    pub epochs: Option<u64>,
    /// Initial parameters (safetensors) instead of seeded ones.
    pub init: Option<PathBuf>,
    /// One fixed batch (safetensors holding x and y) trained on at every step.
    pub data: Option<PathBuf>,
    /// A data set read batch by batch over epochs ([`datasets::open_dataset_as`]).
    pub dataset: Option<PathBuf>,
    /// How `dataset` (and the validation set) are read: detected from their first bytes, or
    /// the format the user names.
    pub dataset_format: datasets::DatasetFormat,
    /// How batches are drawn from the data set.
    pub order: Option<Order>,
    /// The seed of the data set's shuffle (default: `seed`).
    pub shuffle_seed: Option<u64>,
    /// Where checkpoints go, every `checkpoint_every` steps and at the end.
    pub checkpoint: Option<PathBuf>,
    pub checkpoint_every: Option<u64>,
    /// The checkpoint directory a resumed run goes on from.
    pub resume: Option<PathBuf>,
    /// Go on past a step whose loss, gradient norm or updated parameters are not finite.
    pub skip_nonfinite: bool,
    /// Where the parameters go after the last step.
    pub save: Option<PathBuf>,
    /// Where the fixed batch the steps train on goes.
    pub save_data: Option<PathBuf>,
    /// The seed of the initial parameters and of the synthetic batch.
    pub seed: u64,
    /// With an evaluator: evaluate every N steps (default: at the end of each epoch).
    pub eval_every: Option<u64>,
    /// Where the HTML report goes ([`crate::report::html`]).
    pub report: Option<PathBuf>,
    /// The learning-rate schedule: its decay, warmup steps and final ratio.
    pub schedule: Decay,
    pub warmup: u64,
    pub min_lr_ratio: f64,
    /// The device the session runs on (for the run's description).
    pub device: session::Device,
    /// The step's optimizer, where known (recorded in checkpoints and compared on resume).
    pub optimizer: Option<ingot_compiler::autodiff::optim::Optimizer>,
    /// The step's gradient clipping (`Some(None)`: none), where known (recorded in
    /// checkpoints and compared on resume, [`checkpoint::check_training`]); a step
    /// executable's is not.
    pub clip_grad_norm: Option<Option<f64>>,
    /// The session holds the weights of the model's file (an ONNX model's), which `init` or
    /// `resume` replace.
    pub file_weights: bool,
    /// The model's weight files are PyTorch `state_dict`s (an imported model's, or any with
    /// batch norms): `init` reads, and `save` writes, its running statistics and
    /// `num_batches_tracked` besides the parameters.
    pub state_dict: Option<StateDict>,
    /// `save` writes a GPT's parameters under these names and layouts (Hugging Face's or
    /// nanoGPT's, [`crate::gpt_names`]) instead of Ingot's. `init` needs no such option: a
    /// file under those names is recognised by them.
    pub names: Option<gpt_names::Naming>,
    /// The device's peak in TFLOP/s that the step's FLOP rate is held against, instead of
    /// [`crate::flop_rate::PEAKS`]'s (`--peak-tflops`).
    pub peak_tflops: Option<f64>,
}

impl RunOptions {
    /// `steps` is needed unless a data set with `epochs` bounds the run.
    pub fn check_steps(&self) -> Result<(), RunError> {
        if self.steps.is_none() && self.epochs.is_none() {
            return Err(RunError::Usage(
                if self.dataset.is_some() {
                    "give --epochs N or --steps N (or both) for a run over --dataset"
                } else {
                    "give --steps N"
                }
                .into(),
            ));
        }
        crate::flop_rate::check_given(self.peak_tflops).map_err(RunError::Usage)?;
        if self.checkpoint_every == Some(0) {
            return Err(RunError::Usage(
                "--checkpoint-every must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Whether a schedule drives the learning rate (the step needs its scale input).
    pub fn scheduled(&self) -> bool {
        self.schedule != Decay::Constant || self.warmup > 0
    }
}

/// What the run says beside its per-step reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// Resuming: the checkpoint's optimizer or precision differs from the run's (the text says
    /// how, and what was done).
    Resume(String),
    /// `skip_nonfinite`: a step whose loss, gradient norm or updated parameters were not finite, gone past.
    Skipped(String),
    /// Files written: `--save`'s parameters, the last checkpoint.
    Saved(String),
    /// What `init` (a `state_dict`) held that the model computes or does not read, ignored.
    Ignored(String),
    /// Names of `init` (a `state_dict`) that are a parameter's tied alias: trained as that
    /// parameter, and written again under their own names by `save`.
    Tied(String),
    /// `init` held a GPT-2 under Hugging Face's or nanoGPT's names, read onto Ingot's GPT
    /// (the text says which naming, and what was tied, ignored or cut).
    Names(String),
    /// A data set's warning: an image of an image folder that could not be read or decoded,
    /// skipped (named once; the summary counts them).
    Data(String),
}

/// How the run's parameters start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    Seeded,
    Loaded,
    Resumed,
    /// The model file's own (an ONNX model's).
    FromFile,
}

/// What a run is, before its first step.
#[derive(Clone, Debug)]
pub struct Start {
    pub model: String,
    pub parameters: usize,
    /// The last step to run, and the epochs asked for.
    pub last: Option<u64>,
    pub epochs: Option<u64>,
    /// The session's device (`cpu`, `cuda:0`, ...), and the session's [`session::Device`].
    pub device_name: String,
    pub device: session::Device,
    pub precision: ingot_compiler::precision::Precision,
    pub weights: Weights,
    /// The data set's description and its batches per epoch; otherwise whether the fixed batch
    /// was loaded (`--data`) or is synthetic.
    pub dataset: Option<(String, u64)>,
    pub loaded_batch: bool,
    /// Resumed: the checkpoint's step and epoch, and its directory.
    pub resumed: Option<(u64, u64, PathBuf)>,
    /// What each epoch leaves out (a partial batch is dropped).
    pub dropped: Option<String>,
    /// The first step's number less one (a resumed run's checkpoint step, else 0).
    pub first: u64,
    /// The planned total of the one allocation.
    pub planned_bytes: usize,
    /// The step's model FLOPs (per rank) and the peak they are held against.
    pub flop_rate: crate::flop_rate::FlopRate,
}

/// One step's report.
#[derive(Clone, Copy, Debug)]
pub struct StepEvent {
    /// The epoch of the step's batch (data set runs only).
    pub epoch: Option<u64>,
    /// The step's number, counted from the run's start (from 1).
    pub step: u64,
    pub result: StepResult,
    /// The wall clock from the end of the previous step's loop iteration to the end of this
    /// one (data waits, staging, the step, the loss's copy, the observer's reporting).
    pub interval_seconds: f64,
    /// ("tokens" or "samples", per second of wall clock, data waits included).
    pub rate: Option<(&'static str, f64)>,
    /// The factor the schedule scaled the learning rate by (scheduled runs only).
    pub lr_scale: Option<f64>,
    /// The gradients' global norm before clipping (steps that clip).
    pub grad_norm: Option<f64>,
    /// The loss and the gradient norm are finite.
    pub finite: bool,
    /// The step's model FLOPs over its `seconds`, in TFLOP/s (per GPU with several), and the
    /// fraction of the device's peak that is, where the peak is known
    /// ([`crate::flop_rate::FlopRate`]).
    pub tflops: Option<f64>,
    pub peak_fraction: Option<f64>,
}

/// An evaluation's report.
#[derive(Clone, Copy, Debug)]
pub struct EvalEvent {
    /// The step after which the evaluation ran.
    pub step: u64,
    pub val_loss: f64,
    /// A classifier's top-1 and top-5 accuracy (fractions), counted in the evaluation step.
    pub top1: Option<f64>,
    pub top5: Option<f64>,
    /// The batches it ran.
    pub batches: u64,
}

/// The end of an epoch of a data set run.
#[derive(Clone, Copy, Debug)]
pub struct EpochEvent {
    pub epoch: u64,
    /// The step that finished it.
    pub step: u64,
    /// The mean of its finite losses.
    pub mean_loss: f64,
    /// GPU only: free device memory now (flat from epoch to epoch when nothing allocates).
    pub free_device_bytes: Option<usize>,
}

/// What a run tells as it goes. Every method does nothing unless implemented; an error stops
/// the run ([`RunError::Observer`]).
pub trait Observer {
    /// Before the first step.
    fn start(&mut self, _start: &Start) -> Result<(), ObserverError> {
        Ok(())
    }
    /// After each step.
    fn step(&mut self, _step: &StepEvent) -> Result<(), ObserverError> {
        Ok(())
    }
    /// After each evaluation.
    fn eval(&mut self, _eval: &EvalEvent) -> Result<(), ObserverError> {
        Ok(())
    }
    /// At the end of each epoch of a data set run.
    fn epoch(&mut self, _epoch: &EpochEvent) -> Result<(), ObserverError> {
        Ok(())
    }
    /// Something said beside the steps.
    fn note(&mut self, _note: &Note) -> Result<(), ObserverError> {
        Ok(())
    }
    /// After the last step (and the last evaluation), before any file is saved.
    fn finish(&mut self, _finished: &Finished) -> Result<(), ObserverError> {
        Ok(())
    }
}

/// An observer that is told nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Observer for Silent {}

/// Trains `session` as `o` says, evaluating with `eval`: loads `init` or `resume` and `data`,
/// writes `save_data`, runs the steps on the fixed batch or over the data set, telling
/// `observer` each one, then writes the report, `save` and the last checkpoint.
pub fn train(
    session: &mut Session,
    o: &RunOptions,
    eval: Option<Evaluator>,
    observer: &mut dyn Observer,
) -> Result<(), RunError> {
    o.check_steps()?;
    let prepared = prepare(session, o, observer)?;
    let start = prepared.resumed.as_ref().map_or(0, |r| r.step);
    let per_epoch = prepared.source.as_ref().map(|s| s.batches_per_epoch());
    let last = match (o.steps, o.epochs, per_epoch) {
        (s, Some(e), Some(p)) => {
            Some(s.map_or(e.saturating_mul(p), |s| s.min(e.saturating_mul(p))))
        }
        (s, _, _) => s,
    };
    let schedule = schedule(session, o, last)?;
    // A resumed run says what it changed of the checkpoint's schedule and clipping.
    if let (Some(info), Some(dir)) = (&prepared.resumed, &o.resume) {
        if let Some(note) =
            checkpoint::check_training(dir, info, schedule.as_ref(), o.clip_grad_norm)
        {
            observer
                .note(&Note::Resume(note))
                .map_err(RunError::Observer)?;
        }
    }
    observer
        .start(&describe(session, o, &prepared, last, per_epoch))
        .map_err(RunError::Observer)?;
    let units = prepared.source.as_ref().map(|s| {
        let tokens = matches!(
            datasets::dataset_kind_as(
                o.dataset.as_deref().expect("given"),
                o.dataset_format.clone()
            ),
            Ok(datasets::DatasetKind::Tokens)
        );
        let x = s.x();
        if tokens {
            ("tokens", x.dims.iter().product())
        } else {
            ("samples", x.dims.first().copied().unwrap_or(0))
        }
    });
    let record = RunRecord {
        model: session.model().to_string(),
        device: session.exe().device(),
        dataset: prepared.dataset.clone(),
        planned_bytes: planned_total(session),
        eval_layout: session.shared_layout(),
        flop_rate: Some(flop_rate(session, o)),
        ..Default::default()
    };
    let Prepared {
        source,
        dataset,
        dataset_fingerprint,
        resumed,
        state_dict,
        image_log,
    } = prepared;
    let mut run = Run {
        o,
        observer,
        record,
        eval,
        evaluated_at: None,
        schedule,
        precision: session.precision().name().to_string(),
        step: start,
        last,
        units,
        dataset,
        dataset_fingerprint,
        shuffle_seed: o.dataset.as_ref().map(|_| o.shuffle_seed.unwrap_or(o.seed)),
        seconds: StepTimes::new(),
        wall: StepTimes::new(),
        steps_run: 0,
        free_after_first: None,
        heap_after_first: None,
        non_finite: None,
        epoch_loss: (0.0, 0),
        last_done: Instant::now(),
        state_dict,
        image_log,
        flop_rate: flop_rate(session, o),
    };
    let last_info = match source {
        None => {
            while !run.done() {
                run.before_step(session)?;
                let r = session.step()?;
                if run.after_step(session, r, None)? == Next::Stop {
                    break;
                }
            }
            None
        }
        Some(source) => {
            let position = resumed.as_ref().and_then(|r| r.position);
            over_data(session, &mut run, source, position)?
        }
    };
    run.finish(session, last_info)
}

/// `file` (read from `path` for `init`) under Ingot's names: mapped from Hugging Face's or
/// nanoGPT's GPT-2 names ([`gpt_names`]) when it holds a GPT-2 under them and the model is
/// Ingot's GPT, telling `observer` so; else as it is.
fn pretrained_names(
    session: &Session,
    path: &Path,
    file: IndexMap<String, Tensor>,
    observer: &mut dyn Observer,
) -> Result<IndexMap<String, Tensor>, RunError> {
    let Some((naming, prefix)) = gpt_names::detect(&file) else {
        return Ok(file);
    };
    let model = session.parameters();
    if gpt_names::gpt_layers(&model).is_none() {
        return Ok(file);
    }
    let (params, notes) =
        gpt_names::to_ingot(&file, &model, naming, &prefix).map_err(|message| {
            RunError::StateDict {
                path: path.to_path_buf(),
                message,
            }
        })?;
    let mut text = format!(
        "{}: read {} tensor(s) under {naming} names onto Ingot's GPT",
        path.display(),
        params.len()
    );
    for note in notes {
        text.push_str("; ");
        text.push_str(&note);
    }
    observer
        .note(&Note::Names(text))
        .map_err(RunError::Observer)?;
    Ok(params)
}

/// What [`prepare`] readies: the data set, its description and identity, and the checkpoint
/// resumed from.
struct Prepared {
    source: Option<Box<dyn BatchSource>>,
    dataset: Option<String>,
    dataset_fingerprint: Option<String>,
    resumed: Option<CheckpointInfo>,
    /// `o.state_dict` with the batch counts `init` held.
    state_dict: Option<StateDict>,
    /// Where an image folder's skipped files are told (the validation folder's too, when it
    /// was opened with the run's format).
    image_log: Option<crate::data::images::SkipLog>,
}

/// Loads `init` and `data`, writes `save_data`, opens the data set (every id checked before
/// the first step, not hours in) and resumes from `resume`.
fn prepare(
    session: &mut Session,
    o: &RunOptions,
    observer: &mut dyn Observer,
) -> Result<Prepared, RunError> {
    let mut state_dict = o.state_dict.clone();
    let init = match (&o.init, &mut state_dict) {
        (Some(path), Some(sd)) => {
            let (dict, metadata) = io::load_with_metadata(path)?;
            sd.load_init(session, &dict, &metadata)
                .map_err(|message| RunError::StateDict {
                    path: path.clone(),
                    message,
                })?;
            if !sd.tied().is_empty() {
                let pairs: Vec<String> = sd
                    .tied()
                    .iter()
                    .map(|(alias, param)| format!("{alias} = {param}"))
                    .collect();
                observer
                    .note(&Note::Tied(format!(
                        "{}: {} tied weight(s), one tensor under two names ({}): trained as the model's parameter, and --save writes both names",
                        path.display(),
                        pairs.len(),
                        pairs.join(", ")
                    )))
                    .map_err(RunError::Observer)?;
            }
            if !sd.ignored.is_empty() {
                observer
                    .note(&Note::Ignored(format!(
                        "{}: ignored {} buffer(s) the model computes or does not read ({})",
                        path.display(),
                        sd.ignored.len(),
                        sd.ignored.join(", ")
                    )))
                    .map_err(RunError::Observer)?;
            }
            &None
        }
        _ => &o.init,
    };
    if let Some(naming) = o.names {
        if gpt_names::gpt_layers(&session.parameters()).is_none() {
            return Err(RunError::Usage(format!(
                "--names writes a GPT's weights under {naming} names, but the model {} is not Ingot's GPT",
                session.model()
            )));
        }
    }
    if let Some(path) = init {
        let params = pretrained_names(session, path, io::load(path)?, observer)?;
        session
            .load_parameters(&params)
            .map_err(|source| RunError::File {
                path: path.clone(),
                source: Box::new(source),
            })?;
    }
    if let Some(path) = &o.data {
        session
            .set_batch_map(&io::load(path)?)
            .map_err(|source| RunError::File {
                path: path.clone(),
                source: Box::new(source),
            })?;
    }
    if let Some(path) = &o.save_data {
        io::save(path, &session.batch())?;
    }
    // An image folder's format, resolved here so that the run holds the log its skipped
    // files are told to (a detected folder otherwise gets a log of its own).
    let format = match &o.dataset {
        Some(path) => match datasets::resolve_format(path, o.dataset_format.clone()) {
            Ok(f @ datasets::DatasetFormat::Images(_)) => f,
            _ => o.dataset_format.clone(),
        },
        None => o.dataset_format.clone(),
    };
    let image_log = match &format {
        datasets::DatasetFormat::Images(images) => Some(images.log.clone()),
        _ => None,
    };
    let source = match &o.dataset {
        Some(path) => {
            let seed = o.shuffle_seed.unwrap_or(o.seed);
            let order = o.order.unwrap_or(Order::Random);
            let s = datasets::open_dataset_as(path, session.graph(), order, seed, format)?;
            // Data parallelism: each rank's own shard of every batch.
            let mut s = crate::data::shard::rank_batches(s, session.exe())?;
            s.check_all()?;
            Some(s)
        }
        None => None,
    };
    let dataset = source.as_ref().map(|s| s.describe());
    let dataset_fingerprint = match (&o.dataset, &dataset) {
        (Some(path), Some(d)) => Some(datasets::dataset_fingerprint(path, d)?),
        _ => None,
    };
    let resumed = match &o.resume {
        Some(dir) => Some(resume(
            session,
            o,
            dir,
            dataset.as_deref(),
            dataset_fingerprint.as_deref(),
            observer,
        )?),
        None => None,
    };
    // A resumed run's --save writes the tied aliases and batch counts its checkpoint recorded.
    if let (Some(sd), Some(info)) = (&mut state_dict, &resumed) {
        if !info.tied.is_empty() {
            sd.set_tied(info.tied.clone());
        }
        sd.set_tracked(&info.tracked);
    }
    Ok(Prepared {
        source,
        dataset,
        dataset_fingerprint,
        resumed,
        state_dict,
        image_log,
    })
}

/// Loads the checkpoint in `dir` into `session` after checking it is this run's.
fn resume(
    session: &mut Session,
    o: &RunOptions,
    dir: &Path,
    dataset: Option<&str>,
    fingerprint: Option<&str>,
    observer: &mut dyn Observer,
) -> Result<CheckpointInfo, RunError> {
    let ck = checkpoint::load(dir).map_err(RunError::Checkpoint)?;
    // First: another number of ranks also cuts the data set differently.
    checkpoint::check_ranks(dir, &ck.info, session.exe().data_ranks())
        .map_err(RunError::Checkpoint)?;
    checkpoint::check_same_run(dir, &ck.info, session.model(), dataset, fingerprint)
        .map_err(RunError::Checkpoint)?;
    if let Some(note) = checkpoint::check_optimizer(dir, &ck.info, o.optimizer.as_ref())
        .map_err(RunError::Checkpoint)?
    {
        observer
            .note(&Note::Resume(note))
            .map_err(RunError::Observer)?;
    }
    if let Some(note) = checkpoint::check_precision(&ck.info, session.precision().name()) {
        observer
            .note(&Note::Resume(format!(
                "checkpoint {}: {note}",
                dir.display()
            )))
            .map_err(RunError::Observer)?;
    }
    let at = |e: SessionError| RunError::Checkpoint(format!("checkpoint {}: {e}", dir.display()));
    session.load_parameters(&ck.parameters).map_err(at)?;
    session
        .load_optimizer_state(&ck.optimizer_state)
        .map_err(at)?;
    // AdamW's step number, where it is an input: the updates the checkpoint made.
    session.set_updates_done(ck.info.step);
    Ok(ck.info)
}

/// The run as its observer is first told it.
fn describe(
    session: &Session,
    o: &RunOptions,
    p: &Prepared,
    last: Option<u64>,
    per_epoch: Option<u64>,
) -> Start {
    Start {
        model: session.model().to_string(),
        parameters: session.parameters().values().map(|t| t.numel()).sum(),
        last,
        epochs: o.epochs,
        device_name: session.exe().device(),
        device: o.device,
        precision: session.precision(),
        weights: if o.resume.is_some() {
            Weights::Resumed
        } else if o.init.is_some() {
            Weights::Loaded
        } else if o.file_weights {
            Weights::FromFile
        } else {
            Weights::Seeded
        },
        dataset: p.dataset.clone().zip(per_epoch),
        loaded_batch: o.data.is_some(),
        resumed: p.resumed.as_ref().map(|r| {
            (
                r.step,
                r.epoch,
                o.resume.clone().expect("resumed from a directory"),
            )
        }),
        dropped: p
            .source
            .as_ref()
            .map(|s| s.dropped_per_epoch())
            .filter(|d| d.count > 0)
            .map(|d| {
                format!(
                    "each epoch leaves out the last {} {} (a partial batch is dropped)",
                    d.count, d.unit
                )
            }),
        first: p.resumed.as_ref().map_or(0, |r| r.step),
        planned_bytes: planned_total(session),
        flop_rate: flop_rate(session, o),
    }
}

/// The step's model FLOPs and the peak of the session's device at its precision (or the one
/// `o` gives).
fn flop_rate(session: &Session, o: &RunOptions) -> crate::flop_rate::FlopRate {
    crate::flop_rate::FlopRate::new(
        session.model_flops(),
        &session.exe().device(),
        session.precision(),
        o.peak_tflops,
    )
}

/// The learning-rate schedule of a scheduled run, checked against the step and the options.
fn schedule(
    session: &Session,
    o: &RunOptions,
    last: Option<u64>,
) -> Result<Option<Schedule>, RunError> {
    match (o.scheduled(), session.has_lr_scale()) {
        (true, false) => Err(RunError::NoLrScaleInput),
        (true, true) => {
            if !(0.0..=1.0).contains(&o.min_lr_ratio) {
                return Err(RunError::Usage(format!(
                    "--min-lr-ratio must be in [0, 1], not {}",
                    o.min_lr_ratio
                )));
            }
            let total = last.ok_or_else(|| {
                RunError::Usage(
                    "a schedule needs the run's length: give --steps or --epochs".into(),
                )
            })?;
            Ok(Some(Schedule {
                decay: o.schedule,
                warmup: o.warmup,
                total,
                min_ratio: o.min_lr_ratio,
            }))
        }
        (false, _) => Ok(None),
    }
}

/// The step loop over a data set: a loader thread fills two staging buffers in turn, each
/// batch goes straight into the input slots, and the staged batch is handed back only after its
/// step (and so its copy) finished. Returns the last batch's info.
fn over_data(
    session: &mut Session,
    run: &mut Run<'_>,
    source: Box<dyn BatchSource>,
    position: Option<crate::data::Position>,
) -> Result<Option<BatchInfo>, RunError> {
    let mut epochs = Epochs::new(source);
    if let Some(e) = run.o.epochs {
        epochs = epochs.epochs(e);
    }
    if let Some(p) = position {
        epochs.restore(p).map_err(|e| {
            RunError::Checkpoint(format!(
                "checkpoint {}: {e}",
                run.o.resume.as_deref().map(Path::display).expect("resumed")
            ))
        })?;
    }
    let slots = session.input_slots()?;
    match session.cuda() {
        Some(c) => {
            let mut buffers = Vec::with_capacity(2);
            for _ in 0..2 {
                buffers.push(Staging {
                    x: c.pinned_buffer(slots[0].1)?,
                    y: c.pinned_buffer(slots[1].1)?,
                });
            }
            let buffers: [_; 2] = buffers.try_into().ok().expect("two");
            staged_loop(session, run, epochs, buffers, &slots)
        }
        None => {
            let buffers = [0, 1].map(|_| Staging {
                x: vec![0u8; slots[0].1],
                y: vec![0u8; slots[1].1],
            });
            staged_loop(session, run, epochs, buffers, &slots)
        }
    }
}

fn staged_loop<B>(
    session: &mut Session,
    run: &mut Run<'_>,
    epochs: Epochs<Box<dyn BatchSource>>,
    buffers: [Staging<B>; 2],
    slots: &[(NodeId, usize); 2],
) -> Result<Option<BatchInfo>, RunError>
where
    B: AsMut<[u8]> + std::ops::Deref<Target = [u8]> + Send + 'static,
{
    let mut last = None;
    if run.done() {
        return Ok(last);
    }
    let mut loader = Loader::spawn(epochs, buffers)?;
    run.last_done = Instant::now();
    while !run.done() {
        let Some(batch) = loader.next_batch()? else {
            break;
        };
        run.before_step(session)?;
        let r = session.step_on(slots, &batch.x, &batch.y)?;
        let info = batch.info;
        drop(batch);
        last = Some(info);
        if run.after_step(session, r, Some(info))? == Next::Stop {
            break;
        }
    }
    Ok(last)
}

/// What the step loop has learnt so far, and whom it tells. Of fixed size: nothing in it grows
/// with the steps.
struct Run<'a> {
    o: &'a RunOptions,
    observer: &'a mut dyn Observer,
    /// What the report draws.
    record: RunRecord,
    /// The validation step, and the step of the last evaluation.
    eval: Option<Evaluator>,
    evaluated_at: Option<u64>,
    /// The learning-rate schedule, when the step has its scale input.
    schedule: Option<Schedule>,
    /// The precision line saved in checkpoints.
    precision: String,
    /// Steps done, counted from the run's start (a resumed run starts at the checkpoint's).
    step: u64,
    /// The last step to run.
    last: Option<u64>,
    /// "tokens" or "samples" and how many a batch holds (data set runs).
    units: Option<(&'static str, usize)>,
    dataset: Option<String>,
    /// The data set's identity saved in checkpoints ([`datasets::dataset_fingerprint`]).
    dataset_fingerprint: Option<String>,
    shuffle_seed: Option<u64>,
    /// The steps' own times and their wall-clock times.
    seconds: StepTimes,
    wall: StepTimes,
    /// Steps run by this process.
    steps_run: u64,
    free_after_first: Option<Vec<usize>>,
    /// CPU only, where the process counts its heap: its live bytes as the first step left
    /// them (read when the second step has run, at the point every later step's are read).
    heap_after_first: Option<usize>,
    /// The first step with a non-finite loss, gradient norm or updated parameter, and which, where the run
    /// stopped without `skip_nonfinite`.
    non_finite: Option<(u64, String)>,
    /// Loss sum and steps of the current epoch.
    epoch_loss: (f64, u64),
    last_done: Instant,
    /// The imported model's `state_dict` format, for `save` ([`RunOptions::state_dict`]).
    state_dict: Option<StateDict>,
    /// An image folder's skipped files ([`Prepared::image_log`]).
    image_log: Option<crate::data::images::SkipLog>,
    /// The step's model FLOPs and the device's peak, for each step's rate.
    flop_rate: crate::flop_rate::FlopRate,
}

/// Whether the loop goes on.
#[derive(PartialEq)]
enum Next {
    Go,
    Stop,
}

impl Run<'_> {
    /// Writes the schedule's learning-rate factor for the next step (allocates nothing).
    fn before_step(&self, session: &mut Session) -> Result<(), RunError> {
        if let Some(s) = self.schedule {
            session.set_lr_scale(s.factor(self.step))?;
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.last.is_some_and(|l| self.step >= l)
    }

    /// Records and reports step `self.step + 1`'s result; writes a checkpoint when one is due.
    /// `info` is the batch's (data set runs).
    fn after_step(
        &mut self,
        session: &mut Session,
        r: StepResult,
        info: Option<BatchInfo>,
    ) -> Result<Next, RunError> {
        self.step += 1;
        let i = self.step;
        let now = Instant::now();
        let interval = now.duration_since(self.last_done).as_secs_f64();
        self.last_done = now;
        self.seconds.push(r.seconds);
        self.wall.push(r.wall_seconds);
        self.steps_run += 1;
        if self.steps_run == 1 {
            self.free_after_first = free_on_gpus(session)?;
            self.measure_memory(session)?;
        } else if session.host_loaded_bytes().is_some() {
            // The heap as the first step left it, its reporting done (what the observer keeps
            // from its first call is the run's, not a step's), read where every later step's is.
            if self.steps_run == 2 {
                self.heap_after_first = crate::host_memory::live_bytes();
            }
            // On the CPU every step is drawn: reading the count is one atomic load.
            self.measure_memory(session)?;
        }
        if r.loss.is_finite() {
            self.record.losses.push(i, r.loss);
        }
        let grad_norm = session.last_grad_norm();
        // The step's own count of non-finite parameters after its update (a finite loss can
        // be followed by an update that overflows): read as the loss is, each step.
        let nonfinite = session.last_nonfinite_count()?.filter(|&n| n != 0.0);
        let finite =
            r.loss.is_finite() && grad_norm.is_none_or(f64::is_finite) && nonfinite.is_none();
        let event = StepEvent {
            epoch: info.map(|b| b.epoch),
            step: i,
            result: r,
            interval_seconds: interval,
            rate: self
                .units
                .map(|(unit, n)| (unit, n as f64 / interval.max(1e-12))),
            lr_scale: self.schedule.map(|s| s.factor(i - 1)),
            grad_norm,
            finite,
            tflops: self.flop_rate.tflops(r.seconds),
            peak_fraction: self.flop_rate.fraction(r.seconds),
        };
        self.observer.step(&event).map_err(RunError::Observer)?;
        self.tell_skipped()?;
        if !finite {
            let what = if !r.loss.is_finite() {
                format!("the loss is {}", r.loss)
            } else if let Some(norm) = grad_norm.filter(|n| !n.is_finite()) {
                format!("the gradient norm is {norm}")
            } else {
                // Only now are the parameters read, to name the first that is not finite.
                let count = nonfinite.unwrap_or(f64::NAN);
                let first = session.first_nonfinite_parameter().unwrap_or_else(|| {
                    "a parameter is not finite (but none read back is)".to_string()
                });
                format!("after its update, {first}; the step counted {count} such values")
            };
            if !self.o.skip_nonfinite {
                self.non_finite = Some((i, what));
                return Ok(Next::Stop);
            }
            let note = format!(
                "step {i}: {what}; --skip-nonfinite: going on (the step's update was applied)"
            );
            self.observer
                .note(&Note::Skipped(note))
                .map_err(RunError::Observer)?;
        } else {
            self.epoch_loss.0 += r.loss;
        }
        self.epoch_loss.1 += 1;
        let epoch_ended = info.is_some_and(|b| b.next.batch == 0);
        if let Some(b) = info.filter(|_| epoch_ended) {
            self.end_epoch(session, b.epoch)?;
        }
        let due = match self.o.eval_every {
            Some(n) => i.is_multiple_of(n),
            None => epoch_ended,
        };
        if due {
            self.evaluate(session)?;
        }
        if let (Some(dir), Some(every)) = (&self.o.checkpoint, self.o.checkpoint_every) {
            if i.is_multiple_of(every) && !self.done() {
                self.save_checkpoint(dir, session, info)?;
            }
        }
        Ok(Next::Go)
    }

    /// Runs the validation step (if any) on the current parameters and reports its loss.
    fn evaluate(&mut self, session: &mut Session) -> Result<(), RunError> {
        let Some(eval) = &mut self.eval else {
            return Ok(());
        };
        if self.evaluated_at == Some(self.step) {
            return Ok(());
        }
        let v = eval.evaluate_all(session).map_err(RunError::Eval)?;
        self.record.val.push(self.step, v.loss);
        if let (Some(a), Some(b)) = (v.top1, v.top5) {
            self.record.val_top_k.push(self.step, (a, b));
        }
        self.evaluated_at = Some(self.step);
        let event = EvalEvent {
            step: self.step,
            val_loss: v.loss,
            top1: v.top1,
            top5: v.top5,
            batches: eval.batches(),
        };
        self.tell_skipped()?;
        self.observer.eval(&event).map_err(RunError::Observer)
    }

    /// Tells the observer the images skipped since it was last told, one note per file.
    fn tell_skipped(&mut self) -> Result<(), RunError> {
        let Some(log) = &self.image_log else {
            return Ok(());
        };
        for warning in log.take_new() {
            self.observer
                .note(&Note::Data(warning))
                .map_err(RunError::Observer)?;
        }
        Ok(())
    }

    /// Records the memory the run holds now. On a GPU: the allocation plus any drop in free
    /// memory since the first step. On the CPU (where the process counts its heap): the bytes
    /// loading the step took plus any growth of the heap since the first step.
    fn measure_memory(&mut self, session: &Session) -> Result<(), RunError> {
        if let (Some(loaded), Some(now)) = (
            session.host_loaded_bytes(),
            crate::host_memory::live_bytes(),
        ) {
            let grown = self
                .heap_after_first
                .map_or(0, |first| now as i64 - first as i64);
            let held = loaded as i64 + grown;
            self.record.memory.push(self.step, held.max(0) as usize);
        }
        if let (Some(c), Some(first)) = (
            session.cuda(),
            self.free_after_first
                .as_ref()
                .and_then(|f| f.first().copied()),
        ) {
            let now = c.free_memory()? as i64;
            let held = c.memory().allocation as i64 + (first as i64 - now);
            self.record.memory.push(self.step, held.max(0) as usize);
        }
        Ok(())
    }

    fn end_epoch(&mut self, session: &Session, epoch: u64) -> Result<(), RunError> {
        self.measure_memory(session)?;
        let (sum, n) = std::mem::take(&mut self.epoch_loss);
        let event = EpochEvent {
            epoch,
            step: self.step,
            mean_loss: sum / n.max(1) as f64,
            free_device_bytes: session.cuda().map(CudaStep::free_memory).transpose()?,
        };
        self.observer.epoch(&event).map_err(RunError::Observer)
    }

    fn save_checkpoint(
        &self,
        dir: &Path,
        session: &Session,
        info: Option<BatchInfo>,
    ) -> Result<(), RunError> {
        if !writes_files(session) {
            return Ok(());
        }
        let record = CheckpointInfo {
            format: checkpoint::FORMAT,
            step: self.step,
            epoch: info.map_or(0, |b| b.next.epoch),
            position: info.map(|b| b.next),
            shuffle_seed: self.shuffle_seed,
            model: session.model().to_string(),
            device: session.exe().device(),
            precision: self.precision.clone(),
            dataset: self.dataset.clone(),
            schedule: self.schedule,
            clip_grad_norm: self.o.clip_grad_norm,
            dataset_fingerprint: self.dataset_fingerprint.clone(),
            optimizer_settings: self.o.optimizer.map(|o| o.to_string()),
            ranks: session.exe().data_ranks(),
            weights: String::new(),
            optimizer: String::new(),
            checksums: Default::default(),
            tied: self
                .state_dict
                .as_ref()
                .map(|sd| sd.tied().clone())
                .unwrap_or_default(),
            tracked: self
                .state_dict
                .as_ref()
                .map(|sd| sd.tracked().clone())
                .unwrap_or_default(),
        };
        checkpoint::save(dir, session, record).map_err(RunError::Checkpoint)
    }

    /// After the loop: the last evaluation, the report, the summary, then `save` and the last
    /// checkpoint, unless a non-finite step stopped the run.
    fn finish(mut self, session: &mut Session, last: Option<BatchInfo>) -> Result<(), RunError> {
        let o = self.o;
        // Also a run of no steps (`--steps 0 --val V`, or a finished run resumed): it
        // evaluates the parameters it was given.
        if self.non_finite.is_none() {
            self.evaluate(session)?;
        }
        self.measure_memory(session)?;
        // Before the summary allocates anything of its own (the device's name).
        let heap_change = self
            .heap_after_first
            .zip(crate::host_memory::live_bytes())
            .map(|(first, now)| now as i64 - first as i64);
        let mut finished = summary::finished(
            session,
            &self.seconds,
            &self.wall,
            self.steps_run,
            self.free_after_first.as_deref(),
            self.non_finite.as_ref().map(|(i, _)| *i),
            o.dataset.is_some(),
            &self.flop_rate,
        )?;
        if let Some(path) = &o.report {
            self.record.median_step_seconds = finished.summary.median_step_seconds;
            ingot_compiler::files::write_atomically(
                path,
                crate::report::html(&self.record).as_bytes(),
            )
            .map_err(|source| RunError::Write {
                path: path.clone(),
                source,
            })?;
        }
        self.tell_skipped()?;
        finished.summary.skipped_images = self.image_log.as_ref().map(|l| l.count());
        finished.summary.heap_change_bytes = heap_change;
        self.observer
            .finish(&finished)
            .map_err(RunError::Observer)?;
        if let Some((step, what)) = self.non_finite.take() {
            // The parameters were updated with a non-finite gradient: nothing is saved over a
            // good file (nor a checkpoint).
            return Err(RunError::NonFinite(format!(
                "step {step}: {what}; training stopped at the first non-finite loss, gradient norm or parameter{} (lower the learning rate, or check the data and the initial parameters; --skip-nonfinite goes on past such steps)",
                kept_files(o)
            )));
        }
        if let Some(path) = o.save.as_ref().filter(|_| writes_files(session)) {
            // A finite loss does not make finite weights: the update after it can overflow (a
            // learning rate too large, the gradient of sqrt at 0). Nothing non-finite is written.
            let mut params = session.parameters();
            // An imported model's file is a whole PyTorch state_dict: running statistics and
            // batch counts too, so that `load_state_dict` takes it back.
            if let Some(sd) = &self.state_dict {
                let extra = sd.extra(session, self.step, &params);
                params.extend(extra);
            }
            if let Some(naming) = o.names {
                params = gpt_names::from_ingot(&params, naming).map_err(RunError::Usage)?;
            }
            checkpoint::check_finite("parameter", &params).map_err(|e| {
                RunError::NonFinite(format!(
                    "after step {}: {e}{} (lower the learning rate, or check the data and the initial parameters)",
                    self.step,
                    kept_files(o)
                ))
            })?;
            io::save(path, &params)?;
            self.observer
                .note(&Note::Saved(format!(
                    "saved the parameters{} to {}",
                    match (&self.state_dict, o.names) {
                        (Some(_), _) => " and running statistics (a PyTorch state_dict)".into(),
                        (None, Some(naming)) => format!(" under {naming} names"),
                        (None, None) => String::new(),
                    },
                    path.display()
                )))
                .map_err(RunError::Observer)?;
        }
        if let Some(dir) = &o.checkpoint {
            if self.steps_run > 0 || o.resume.is_none() {
                self.save_checkpoint(dir, session, last)?;
                let note = format!(
                    "saved checkpoint at step {} in {}",
                    self.step,
                    dir.display()
                );
                self.observer
                    .note(&Note::Saved(note))
                    .map_err(RunError::Observer)?;
            }
        }
        Ok(())
    }
}

/// What a failed run leaves as it was, for its error message: `save`'s file not written, the
/// last checkpoint kept.
fn kept_files(o: &RunOptions) -> String {
    let mut kept = Vec::new();
    if let Some(p) = &o.save {
        kept.push(format!("{} was not written", p.display()));
    }
    if let Some(d) = &o.checkpoint {
        kept.push(format!(
            "the last checkpoint in {} is kept (resume from it with --resume {0})",
            d.display()
        ));
    }
    match kept.is_empty() {
        true => String::new(),
        false => format!(", and {}", kept.join("; ")),
    }
}

/// Whether this process writes the run's files (`save`, checkpoints): every run but the
/// processes of a job other than rank 0, whose parameters are rank 0's bits.
pub fn writes_files(session: &Session) -> bool {
    session.exe().data_shard().is_none_or(|(rank, _)| rank == 0)
}
