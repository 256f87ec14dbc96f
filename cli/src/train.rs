//! `ingot train`: train a model and print the loss of each step, on one fixed batch or over a
//! data set (`--dataset`), with checkpoints to stop and resume.
//!
//! Without `--init` the parameters are initialised from `--seed`. Without `--data` or
//! `--dataset` a synthetic batch from the same seed is used for every step. `--data` is one
//! fixed batch (a safetensors file holding x and y), trained on every step; `--dataset` is a data
//! set read batch by batch over epochs (a token stream or a sample set, told apart by
//! [`ingot_trainer::datasets::dataset_kind`]) by a loader thread that fills the next batch into one of
//! two staging buffers (page-locked on the GPU) while the current step runs, each batch copied
//! straight into the input's planned slot ([`Session::step_on`]): nothing is allocated per step.
//! `--save-data` writes the fixed batch used, and `--save` the parameters after the last step
//! (with `--steps 0`, the initial ones), so the same run can be repeated elsewhere (PyTorch:
//! scripts/torch_reference.py).
//!
//! `--steps` and `--epochs` are the run's totals counted from its start: a run resumed from a
//! checkpoint (`--resume DIR`) is given the same flags and goes on from the checkpoint's step
//! and position in the data to the same end. On the CPU its losses are the uninterrupted
//! run's, bit for bit (`tests/train_data.rs`).
//!
//! `ingot run` trains a step executable through the same [`train`] function, so the two print
//! the same lines. On a terminal (stdout, no `--json`) a progress bar shows the epoch, step,
//! last loss, throughput and ETA; elsewhere only the plain lines are printed.

use super::Failure;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ingot_compiler::ir::NodeId;
use ingot_compiler::plan::report::human;
use ingot_runtime::cuda::{CudaOptions, CudaStep};
use ingot_runtime::io;
use ingot_trainer::data::{BatchInfo, BatchSource, Epochs, Loader, Order, Staging};
use ingot_trainer::eval::Evaluator;
use ingot_trainer::report::RunRecord;
use ingot_trainer::schedule::{Decay, Schedule};
use ingot_trainer::session::{self, Session, StepResult};
use ingot_trainer::{checkpoint, datasets};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where the step runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

/// How batches are drawn from a data set.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DataOrder {
    /// Token rows at random offsets (nanoGPT's get_batch); samples reshuffled every epoch.
    #[default]
    Shuffled,
    /// Token rows in file order (llm.c's loader); samples in file order.
    Sequential,
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: super::ModelArgs,
    #[command(flatten)]
    pub run: StepArgs,
    /// Keep attention as the plain math it is written in (scores, softmax, ·v) instead of
    /// replacing it by the fused attention op (for comparisons).
    #[arg(long = "no-fuse-attention")]
    pub no_fuse_attention: bool,
    /// Data-parallel training on N GPUs of this machine over NCCL, one thread per GPU: the
    /// model's batch is each GPU's; gradients are averaged in buckets of about 25 MiB as the
    /// backward pass makes them. NCCL's memory is reported on its own line.
    #[arg(long, value_name = "N")]
    pub gpus: Option<u64>,
    /// Run as one process of a data-parallel job of one process per GPU, started the way
    /// torchrun starts jobs (`torchrun --no-python --nproc-per-node N ingot train --torchrun
    /// ...`): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT come from the
    /// environment; rank 0 listens for the others on MASTER_PORT + 1 (or INGOT_RDZV_PORT).
    /// Each process drives GPU LOCAL_RANK and reads its own shard of --dataset; rank 0 prints
    /// the run (losses averaged over the ranks) and writes --save and the checkpoints.
    #[arg(long, conflicts_with = "gpus")]
    pub torchrun: bool,
}

/// How to run the steps: the options `ingot train` and `ingot run` share.
#[derive(clap::Args, Debug)]
pub struct StepArgs {
    /// Number of training steps, counted from the run's start (0: only initialise, e.g. to
    /// --save the initial parameters). With --dataset, give --steps, --epochs or both (the run
    /// ends at whichever comes first).
    #[arg(long)]
    pub steps: Option<u64>,
    /// With --dataset: the number of epochs (passes over the data set), counted from the
    /// run's start.
    #[arg(long, requires = "dataset")]
    pub epochs: Option<u64>,
    /// Where to run the steps (train: cpu unless given; run: the executable's target).
    #[arg(long, value_enum)]
    pub device: Option<Device>,
    /// Initial parameters (safetensors, PyTorch names and layouts) instead of seeded ones.
    #[arg(long, value_name = "P.safetensors", conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// One fixed batch (safetensors holding x and y), trained on at every step, instead of a
    /// synthetic one.
    #[arg(long, value_name = "B.safetensors", conflicts_with = "dataset")]
    pub data: Option<PathBuf>,
    /// A data set read batch by batch over epochs: a token stream for a language model (raw
    /// uint16 as nanoGPT's train.bin, an llm.c shard, a 1-D .npy; `ingot data bytes` makes one
    /// from any text) or samples for a classifier (a directory holding x.npy and y.npy, or a
    /// safetensors file holding x and y). A final partial batch of each epoch is dropped.
    #[arg(long, value_name = "PATH")]
    pub dataset: Option<PathBuf>,
    /// With --dataset: shuffled (token rows at random offsets, samples reshuffled each epoch)
    /// or sequential (file order).
    #[arg(long, value_enum, default_value_t = DataOrder::Shuffled, requires = "dataset")]
    pub order: DataOrder,
    /// With --dataset: the seed of the shuffle or of the random offsets (default: --seed).
    #[arg(long = "shuffle-seed", requires = "dataset")]
    pub shuffle_seed: Option<u64>,
    /// Write checkpoints into this directory (the weights and optimizer state as safetensors,
    /// and checkpoint.json), every --checkpoint-every steps and at the end of the run.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// With --checkpoint: save every N steps (default: only at the end).
    #[arg(long = "checkpoint-every", value_name = "N", requires = "checkpoint")]
    pub checkpoint_every: Option<u64>,
    /// Continue the run saved in this checkpoint directory: give the same model, data set and
    /// --steps/--epochs as the run that wrote it.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Keep going after a step whose loss is NaN or infinite, logging it (default: stop there,
    /// naming the step, with the last checkpoint kept). The step's update is NOT undone: it
    /// runs inside the compiled step and has been applied when the loss is seen, so parameters
    /// it made non-finite stay so; prefer resuming from the last checkpoint with a lower
    /// learning rate.
    #[arg(long = "skip-nonfinite")]
    pub skip_nonfinite: bool,
    /// Write the parameters after the last step here.
    #[arg(long, value_name = "P.safetensors")]
    pub save: Option<PathBuf>,
    /// Write the fixed batch the steps train on (x and y) here.
    #[arg(
        long = "save-data",
        value_name = "B.safetensors",
        conflicts_with = "dataset"
    )]
    pub save_data: Option<PathBuf>,
    /// Print one JSON object per step ({"step", "loss", "seconds", "wall_seconds",
    /// "interval_seconds"}; with
    /// --dataset also "epoch" and "tokens_per_s" or "samples_per_s"), one {"epoch_end": ..}
    /// per finished epoch, then one {"summary": {..}} with the planned and measured memory and
    /// the median step time.
    #[arg(long)]
    pub json: bool,
    /// Seed of the initial parameters and of the synthetic batch.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub precision: super::PrecisionArgs,
    /// A validation set (of the same kind as --dataset): its loss under the current parameters
    /// is computed by a forward-only step every --eval-every steps (default: at the end of each
    /// epoch) and at the end of the run (`ingot train` only).
    #[arg(long, value_name = "PATH", requires = "dataset")]
    pub val: Option<PathBuf>,
    /// With --val: evaluate every N steps.
    #[arg(long = "eval-every", value_name = "N", requires = "val")]
    pub eval_every: Option<u64>,
    /// With --val: the batches each evaluation runs (the first K of the set, in order).
    #[arg(
        long = "eval-batches",
        value_name = "K",
        default_value_t = 20,
        requires = "val"
    )]
    pub eval_batches: u64,
    /// Write one self-contained HTML page here at the end: the loss and validation curves and
    /// the memory over the run, planned beside measured.
    #[arg(long, value_name = "run.html")]
    pub report: Option<PathBuf>,
    /// The learning rate's decay after the warmup, from the optimizer's rate down to
    /// --min-lr-ratio times it at the run's last step. Any schedule (or --warmup) compiles the
    /// step with a learning-rate scale input that the host writes before each step.
    #[arg(long, value_enum, default_value_t = Decay::Constant)]
    pub schedule: Decay,
    /// Steps of linear warmup: step i (from 0) runs at (i + 1) / (N + 1) of the rate.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub warmup: u64,
    /// The schedule's final learning rate as a fraction of the optimizer's (e.g. 0.1).
    #[arg(long = "min-lr-ratio", value_name = "R", default_value_t = 0.0)]
    pub min_lr_ratio: f64,
}

impl StepArgs {
    /// Checks, before anything is compiled or run, that the run's output files can be written
    /// and that none is the same file as one of its inputs (`inputs`, the model file or the
    /// executable, besides --init, --data and the files of --dataset and --val) or as another
    /// output; then takes the checkpoint directories (--checkpoint, and --resume's, which
    /// another run could be rewriting) for the run, which holds them as long as it keeps the
    /// returned locks. `writes` is false in the processes of a job other than rank 0: they write
    /// no file and take no lock.
    pub fn check_outputs(
        &self,
        inputs: &[(&str, Option<&Path>)],
        writes: bool,
    ) -> Result<Vec<checkpoint::DirLock>, Failure> {
        let data_files: Vec<(&str, PathBuf)> = [("--dataset", &self.dataset), ("--val", &self.val)]
            .into_iter()
            .filter_map(|(option, path)| Some((option, path.as_deref()?)))
            .flat_map(|(option, path)| {
                datasets::dataset_files(path)
                    .into_iter()
                    .map(move |f| (option, f))
            })
            .collect();
        let mut all_inputs = inputs.to_vec();
        all_inputs.push(("--init", self.init.as_deref()));
        all_inputs.push(("--data", self.data.as_deref()));
        all_inputs.extend(data_files.iter().map(|(o, f)| (*o, Some(f.as_path()))));
        super::check_outputs(
            &[
                ("--save", self.save.as_deref()),
                ("--save-data", self.save_data.as_deref()),
                ("--report", self.report.as_deref()),
            ],
            &all_inputs,
        )?;
        if !writes {
            return Ok(Vec::new());
        }
        let mut locks: Vec<checkpoint::DirLock> = Vec::new();
        // A --resume directory that is not there is for `checkpoint::load` to name.
        let resume = self.resume.as_deref().filter(|d| d.is_dir());
        for dir in [self.checkpoint.as_deref(), resume].into_iter().flatten() {
            if locks
                .iter()
                .any(|l| ingot_compiler::files::same_file(&l.dir, dir))
            {
                continue;
            }
            let lock = checkpoint::lock(dir).map_err(|e| Failure::new(1, e))?;
            if !lock.removed.is_empty() {
                eprintln!(
                    "ingot: checkpoint {}: removed what an interrupted save left there: {}",
                    dir.display(),
                    lock.removed.join(", ")
                );
            }
            locks.push(lock);
        }
        Ok(locks)
    }

    /// The session device these arguments ask for; `default` when `--device` is not given.
    pub fn session_device(&self, default: Device) -> Result<session::Device, Failure> {
        let device = self.device.unwrap_or(default);
        // Refuses tf32 on the CPU; the compile takes the precision itself (`opts.precision`).
        self.precision.for_device(device)?;
        match device {
            Device::Cpu => Ok(session::Device::Cpu),
            Device::Cuda => Ok(session::Device::Cuda(CudaOptions::default())),
        }
    }
}

/// One line of `--json` output, fields in this order.
#[derive(serde::Serialize)]
struct StepLine {
    /// The epoch of the step's batch (data set runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    step: u64,
    loss: f64,
    /// The step's device time on a GPU, its wall-clock time on the CPU.
    seconds: f64,
    /// The wall clock of the step and the loss's copy to the host.
    wall_seconds: f64,
    /// Step to step: the wall clock from the end of the previous step's loop iteration to the
    /// end of this one (data waits, staging, the step, the loss's copy, this line's printing):
    /// what a run's throughput is made of, on a fixed batch and over a data set alike.
    interval_seconds: f64,
    /// Tokens (of a token stream) trained on per second of wall clock, data waits included.
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens_per_s: Option<f64>,
    /// Samples (of a sample set) trained on per second of wall clock, data waits included.
    #[serde(skip_serializing_if = "Option::is_none")]
    samples_per_s: Option<f64>,
    /// The factor the schedule scaled the learning rate by (scheduled runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    lr_scale: Option<f64>,
    /// The gradients' global norm before clipping (with --clip-grad-norm).
    #[serde(skip_serializing_if = "Option::is_none")]
    grad_norm: Option<f64>,
    /// Present (and true) only on a step whose loss is NaN or infinite: `loss` alone would
    /// print as `null` for both.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    non_finite: bool,
}

/// The `--json` line of an evaluation.
#[derive(serde::Serialize)]
struct EvalLine {
    /// The step after which the evaluation ran.
    eval_step: u64,
    val_loss: f64,
}

/// The `--json` line at the end of each epoch of a data set run.
#[derive(serde::Serialize)]
struct EpochLine {
    epoch_end: u64,
    /// The step that finished it.
    step: u64,
    mean_loss: f64,
    /// GPU only: free device memory now (flat from epoch to epoch when nothing allocates).
    #[serde(skip_serializing_if = "Option::is_none")]
    free_device_bytes: Option<usize>,
}

pub fn run(a: &TrainArgs) -> Result<(), Failure> {
    check_sharding(a)?;
    if let Some(n) = a.gpus {
        super::gpus::check(n, a.run.device, a.model.ranks)?;
    }
    let launch = match a.torchrun {
        true => Some(super::gpus::launch_env(a.run.device, a.model.ranks)?),
        false => None,
    };
    let default_device = match (a.gpus, &launch) {
        (None, None) => Device::Cpu,
        _ => Device::Cuda,
    };
    let mut device = a.run.session_device(default_device)?;
    if let (Some(env), session::Device::Cuda(o)) = (&launch, &mut device) {
        o.ordinal = env.local_rank;
        crate::set_quiet(env.rank != 0);
    }
    let _held = a.run.check_outputs(
        &a.model.input_files(),
        launch.as_ref().is_none_or(|env| env.rank == 0),
    )?;
    a.run.check_steps()?;
    // Compiled with the stage spinner (on a terminal, not with --json), then loaded.
    let mut opts = device.options();
    opts.precision = a
        .run
        .precision
        .for_device(a.run.device.unwrap_or(default_device))?;
    opts.fuse_attention &= !a.no_fuse_attention;
    let scheduled = a.run.schedule != Decay::Constant || a.run.warmup > 0;
    // AdamW's step number is an input the session counts, so the one compiled step serves a
    // resumed run too; the learning-rate scale input only where a schedule drives it.
    let mut step_options = a.model.step_options(scheduled);
    step_options.step_input = true;
    if let Some(n) = a.gpus {
        step_options.ranks = n as usize;
    }
    if let Some(env) = &launch {
        step_options.ranks = env.world;
    }
    if a.run.val.is_some() && (a.run.eval_batches == 0 || a.run.eval_every == Some(0)) {
        return Err(Failure::new(
            2,
            "--eval-batches and --eval-every must be at least 1",
        ));
    }
    let (model, compiled, _, fitted) =
        super::stages::load_and_compile(&a.model, &step_options, &opts, !a.run.json)?;
    if let Some(f) = &fitted {
        if a.run.json {
            let line = serde_json::json!({ "fitted": f });
            crate::outln!("{line}")?;
        } else {
            crate::outln!("{}", f.line())?;
        }
    }
    let exe = compiled
        .executable(device.target())
        .map_err(|e| Failure::new(1, format!("lowering for {}: {e}", device.target())))?;
    let (mut session, eval) = match &a.run.val {
        // The validation step is planned into the training step's allocation.
        Some(val) => {
            let session = match &launch {
                Some(env) => {
                    let pair = ingot_trainer::eval::pair_with_eval(&model, exe, &opts)
                        .map_err(|e| Failure::new(1, e))?;
                    Session::from_process_rank_pair(pair, a.run.seed, env, false)?
                }
                None => {
                    ingot_trainer::eval::session_with_eval(&model, exe, &opts, a.run.seed, device)
                        .map_err(|e| Failure::new(1, e))?
                }
            };
            let eval = Evaluator::new(&session, val, a.run.eval_batches, a.run.seed)
                .map_err(|e| Failure::new(1, e))?;
            (session, Some(eval))
        }
        None => match &launch {
            Some(env) => (
                Session::from_process_rank(exe, a.run.seed, env, false)?,
                None,
            ),
            None => (Session::from_executable(exe, a.run.seed, device)?, None),
        },
    };
    // An ONNX model starts from the file's weights (--init, applied later, replaces them).
    let state_dict = a.model.onnx.load_weights(&mut session)?;
    // NCCL's communicator, kept for the run; its memory measured once, before the first step.
    let _nccl = match a.gpus {
        _ if a.torchrun => {
            let r = super::gpus::process_info(&session)
                .ok_or_else(|| Failure::new(1, "--torchrun: the session is not a process rank"))?;
            super::gpus::report(&r, a.run.json)?;
            Some(r)
        }
        Some(n) if n > 1 => {
            let r = super::gpus::ranks_info(&session)
                .ok_or_else(|| Failure::new(1, "--gpus: the session is not on GPU ranks"))?;
            super::gpus::report(&r, a.run.json)?;
            Some(r)
        }
        Some(_) => {
            let r = super::gpus::one_rank(&session)?;
            super::gpus::report(&r, a.run.json)?;
            Some(r)
        }
        None => None,
    };
    train_with(
        &mut session,
        &a.run,
        device,
        eval,
        Some(model.optimizer),
        state_dict,
    )
}

/// `--shard-optimizer` against what cannot go with it in a run, before anything compiles:
/// one process of a `--torchrun` job holds one rank's rows of each sharded weight, and
/// reading, saving or checkpointing the whole weight would need a collective the runtime does
/// not have. Then the number of ranks ([`super::ModelArgs::check_shard_optimizer`]).
fn check_sharding(a: &TrainArgs) -> Result<(), Failure> {
    if !a.model.shard_optimizer {
        return Ok(());
    }
    if a.torchrun {
        return Err(Failure::new(
            2,
            "--shard-optimizer cannot run with --torchrun: one process holds one rank's rows \
            of each weight, and the whole weights (--save, checkpoints) would need a \
            collective; use --gpus N for sharded GPU ranks in one process",
        ));
    }
    a.model
        .check_shard_optimizer(a.gpus.unwrap_or(a.model.ranks))
}

impl StepArgs {
    /// `--steps` is needed unless `--dataset` with `--epochs` bounds the run.
    pub fn check_steps(&self) -> Result<(), Failure> {
        if self.steps.is_none() && self.epochs.is_none() {
            return Err(Failure::new(
                2,
                if self.dataset.is_some() {
                    "give --epochs N or --steps N (or both) for a run over --dataset"
                } else {
                    "give --steps N"
                },
            ));
        }
        if self.checkpoint_every == Some(0) {
            return Err(Failure::new(2, "--checkpoint-every must be at least 1"));
        }
        Ok(())
    }
}

/// What the step loop has learnt so far, and how it reports.
struct Run<'a> {
    a: &'a StepArgs,
    /// What --report draws.
    record: RunRecord,
    /// The validation step (--val), and the last validation loss.
    eval: Option<Evaluator>,
    val_loss: Option<f64>,
    /// The step of the last evaluation.
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
    /// The optimizer and its settings saved in checkpoints, where known.
    optimizer: Option<ingot_compiler::models::Optimizer>,
    shuffle_seed: Option<u64>,
    bar: Option<ProgressBar>,
    planned: String,
    seconds: Vec<f64>,
    wall: Vec<f64>,
    free_after_first: Option<Vec<usize>>,
    /// The first step with a non-finite loss or gradient norm, and which, where the run
    /// stopped without --skip-nonfinite.
    non_finite: Option<(u64, String)>,
    skipped: u64,
    /// Loss sum and steps of the current epoch.
    epoch_loss: (f64, u64),
    last_done: Instant,
}

/// Whether the loop goes on.
#[derive(PartialEq)]
enum Next {
    Go,
    Stop,
}

impl Run<'_> {
    /// Writes the schedule's learning-rate factor for the next step (allocates nothing).
    fn before_step(&self, session: &mut Session) -> Result<(), Failure> {
        if let Some(s) = self.schedule {
            session.set_lr_scale(s.factor(self.step))?;
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.last.is_some_and(|l| self.step >= l)
    }

    /// Records and prints step `self.step + 1`'s result; writes a checkpoint when one is due.
    /// `info` is the batch's (data set runs).
    fn after_step(
        &mut self,
        session: &mut Session,
        r: StepResult,
        info: Option<BatchInfo>,
    ) -> Result<Next, Failure> {
        self.step += 1;
        let i = self.step;
        let now = Instant::now();
        let interval = now.duration_since(self.last_done).as_secs_f64();
        self.last_done = now;
        self.seconds.push(r.seconds);
        self.wall.push(r.wall_seconds);
        if self.seconds.len() == 1 {
            self.free_after_first = free_on_gpus(session)?;
            self.measure_memory(session)?;
        }
        if r.loss.is_finite() {
            self.record.losses.push((i, r.loss));
        }
        let grad_norm = session.last_grad_norm();
        let lr_scale = self.schedule.map(|s| s.factor(i - 1));
        let finite = r.loss.is_finite() && grad_norm.is_none_or(f64::is_finite);
        let rate = self
            .units
            .map(|(unit, n)| (unit, n as f64 / interval.max(1e-12)));
        let epoch = info.map(|b| b.epoch);
        if self.a.json {
            let line = StepLine {
                epoch,
                step: i,
                loss: r.loss,
                seconds: r.seconds,
                wall_seconds: r.wall_seconds,
                interval_seconds: interval,
                tokens_per_s: rate.filter(|r| r.0 == "tokens").map(|r| r.1),
                samples_per_s: rate.filter(|r| r.0 == "samples").map(|r| r.1),
                lr_scale,
                grad_norm,
                non_finite: !finite,
            };
            crate::outln!("{}", json(&line)?)?;
        } else {
            let e = epoch.map(|e| format!("epoch {e:>3}  ")).unwrap_or_default();
            let extra = grad_norm
                .map(|n| format!("  grad norm {n:>10.4}"))
                .unwrap_or_default()
                + &lr_scale
                    .map(|f| format!("  lr x{f:.4}"))
                    .unwrap_or_default();
            let text = format!(
                "{e}step {i:>5}  loss {:>12.6}  {:>9.3} ms{extra}",
                r.loss,
                r.seconds * 1e3
            );
            if let Some(bar) = &self.bar {
                bar.println(text);
                let speed = rate
                    .map(|(unit, v)| format!("  {v:.0} {unit}/s"))
                    .unwrap_or_default();
                let val = self
                    .val_loss
                    .map(|v| format!("  val {v:.4}"))
                    .unwrap_or_default();
                bar.set_message(format!(
                    "{e}loss {:.6}{val}{speed}  {:.3} ms/step  memory {}",
                    r.loss,
                    r.seconds * 1e3,
                    self.planned
                ));
                bar.set_position(i);
            } else {
                crate::outln!("{text}")?;
            }
        }
        if !finite {
            let what = if r.loss.is_finite() {
                format!("the gradient norm is {}", grad_norm.unwrap_or(f64::NAN))
            } else {
                format!("the loss is {}", r.loss)
            };
            if !self.a.skip_nonfinite {
                self.non_finite = Some((i, what));
                return Ok(Next::Stop);
            }
            self.skipped += 1;
            let note = format!(
                "step {i}: {what}; --skip-nonfinite: going on (the step's update was applied)"
            );
            match &self.bar {
                Some(bar) => bar.println(note),
                None => eprintln!("ingot: {note}"),
            }
        } else {
            self.epoch_loss.0 += r.loss;
        }
        self.epoch_loss.1 += 1;
        let epoch_ended = info.is_some_and(|b| b.next.batch == 0);
        if let Some(b) = info.filter(|_| epoch_ended) {
            self.end_epoch(session, b.epoch)?;
        }
        let due = match self.a.eval_every {
            Some(n) => i.is_multiple_of(n),
            None => epoch_ended,
        };
        if due {
            self.evaluate(session)?;
        }
        if let (Some(dir), Some(every)) = (&self.a.checkpoint, self.a.checkpoint_every) {
            if i.is_multiple_of(every) && !self.done() {
                self.save_checkpoint(dir, session, info)?;
            }
        }
        Ok(Next::Go)
    }

    /// Runs the validation step (if any) on the current parameters and reports its loss.
    fn evaluate(&mut self, session: &mut Session) -> Result<(), Failure> {
        let Some(eval) = &mut self.eval else {
            return Ok(());
        };
        if self.evaluated_at == Some(self.step) {
            return Ok(());
        }
        let v = eval.evaluate(session).map_err(|e| Failure::new(1, e))?;
        self.val_loss = Some(v);
        self.record.val.push((self.step, v));
        self.evaluated_at = Some(self.step);
        if self.a.json {
            let line = EvalLine {
                eval_step: self.step,
                val_loss: v,
            };
            crate::outln!("{}", json(&line)?)?;
        } else {
            let text = format!(
                "eval after step {}: val loss {v:.6} over {} batches",
                self.step,
                eval.batches()
            );
            match &self.bar {
                Some(bar) => bar.println(text),
                None => crate::outln!("{text}")?,
            }
        }
        Ok(())
    }

    /// On a GPU, records the device memory the run holds now: the allocation plus any drop
    /// in free memory since the first step.
    fn measure_memory(&mut self, session: &Session) -> Result<(), Failure> {
        if let (Some(c), Some(first)) = (
            session.cuda(),
            self.free_after_first
                .as_ref()
                .and_then(|f| f.first().copied()),
        ) {
            let now = c.free_memory()? as i64;
            let held = c.memory().allocation as i64 + (first as i64 - now);
            self.record.memory.push((self.step, held.max(0) as usize));
        }
        Ok(())
    }

    fn end_epoch(&mut self, session: &Session, epoch: u64) -> Result<(), Failure> {
        self.measure_memory(session)?;
        let (sum, n) = std::mem::take(&mut self.epoch_loss);
        let free = session.cuda().map(CudaStep::free_memory).transpose()?;
        let mean = sum / n.max(1) as f64;
        if self.a.json {
            let line = EpochLine {
                epoch_end: epoch,
                step: self.step,
                mean_loss: mean,
                free_device_bytes: free,
            };
            crate::outln!("{}", json(&line)?)?;
        } else {
            let text = format!(
                "epoch {epoch} done at step {}: mean loss {mean:.6}{}",
                self.step,
                free.map(|f| format!(", free device memory {f} bytes"))
                    .unwrap_or_default()
            );
            match &self.bar {
                Some(bar) => bar.println(text),
                None => crate::outln!("{text}")?,
            }
        }
        Ok(())
    }

    fn save_checkpoint(
        &self,
        dir: &Path,
        session: &Session,
        info: Option<BatchInfo>,
    ) -> Result<(), Failure> {
        if !writes_files(session) {
            return Ok(());
        }
        let record = checkpoint::CheckpointInfo {
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
            dataset_fingerprint: self.dataset_fingerprint.clone(),
            optimizer_settings: self.optimizer.map(|o| o.to_string()),
            ranks: session.exe().data_ranks(),
            weights: String::new(),
            optimizer: String::new(),
            checksums: Default::default(),
        };
        checkpoint::save(dir, session, record).map_err(|e| Failure::new(1, e))
    }
}

fn json(v: &impl serde::Serialize) -> Result<String, Failure> {
    serde_json::to_string(v).map_err(|e| Failure::new(1, e.to_string()))
}

/// Trains `session` as `a` says: loads `--init` or `--resume` and `--data`, writes
/// `--save-data`, runs the steps on the fixed batch or over `--dataset`, printing each one's loss
/// (a line of text, or of JSON), then the summary, then writes `--save` and the last
/// checkpoint. `ingot train` and `ingot run` both end here, so their output is the same.
pub fn train(session: &mut Session, a: &StepArgs, device: session::Device) -> Result<(), Failure> {
    if a.val.is_some() {
        return Err(Failure::new(
            2,
            "--val needs the model's forward pass, which a step executable does not hold: evaluate with `ingot train`",
        ));
    }
    train_with(session, a, device, None, None, None)
}

/// As [`train`], evaluating with `eval` (`--val`) as `a` says; `optimizer` is the step's, where
/// known (recorded in checkpoints and compared on resume); `state_dict`: the session holds
/// the weights of the model's file (an ONNX model's), which `--init` or `--resume` replace;
/// `--init` reads, and `--save` writes, a whole PyTorch `state_dict` for it (running
/// statistics and `num_batches_tracked` included).
fn train_with(
    session: &mut Session,
    a: &StepArgs,
    device: session::Device,
    eval: Option<Evaluator>,
    optimizer: Option<ingot_compiler::models::Optimizer>,
    mut state_dict: Option<super::onnx::StateDict>,
) -> Result<(), Failure> {
    a.check_steps()?;
    let file_weights = state_dict.is_some();
    if let Some(path) = &a.init {
        let params = io::load(path)?;
        match state_dict.as_mut() {
            Some(sd) => {
                sd.load_init(session, &params, path)?;
                if !sd.ignored.is_empty() && !a.json {
                    crate::outln!(
                        "{}: ignored {} buffer(s) the model computes or does not read ({})",
                        path.display(),
                        sd.ignored.len(),
                        sd.ignored.join(", ")
                    )?;
                }
            }
            None => session
                .load_parameters(&params)
                .map_err(|e| Failure::new(1, format!("{}: {e}", path.display())))?,
        }
    }
    if let Some(path) = &a.data {
        let batch = io::load(path)?;
        session
            .set_batch_map(&batch)
            .map_err(|e| Failure::new(1, format!("{}: {e}", path.display())))?;
    }
    if let Some(path) = &a.save_data {
        io::save(path, &session.batch())?;
    }
    let shuffle_seed = a.dataset.as_ref().map(|_| a.shuffle_seed.unwrap_or(a.seed));
    let source = match &a.dataset {
        Some(path) => {
            let order = match a.order {
                DataOrder::Shuffled => Order::Random,
                DataOrder::Sequential => Order::Sequential,
            };
            let seed = shuffle_seed.expect("set with --dataset");
            let s = datasets::open_dataset(path, session.graph(), order, seed)?;
            // Data parallelism: each rank's own shard of every batch.
            let mut s = ingot_trainer::data::shard::rank_batches(s, session.exe())?;
            // Every id checked before the first step, not hours in.
            s.check_all()?;
            Some(s)
        }
        None => None,
    };
    let dataset = source.as_ref().map(|s| s.describe());
    let dataset_fingerprint = match (&a.dataset, &dataset) {
        (Some(path), Some(d)) => Some(datasets::dataset_fingerprint(path, d)?),
        _ => None,
    };
    let resumed = match &a.resume {
        Some(dir) => {
            let ck = checkpoint::load(dir).map_err(|e| Failure::new(1, e))?;
            // First: another number of ranks also cuts the data set differently.
            checkpoint::check_ranks(dir, &ck.info, session.exe().data_ranks())
                .map_err(|e| Failure::new(1, e))?;
            checkpoint::check_same_run(
                dir,
                &ck.info,
                session.model(),
                dataset.as_deref(),
                dataset_fingerprint.as_deref(),
            )
            .map_err(|e| Failure::new(1, e))?;
            if let Some(note) = checkpoint::check_optimizer(dir, &ck.info, optimizer.as_ref())
                .map_err(|e| Failure::new(1, e))?
            {
                eprintln!("ingot: {note}");
            }
            if let Some(note) = checkpoint::check_precision(&ck.info, session.precision().name()) {
                eprintln!("ingot: checkpoint {}: {note}", dir.display());
            }
            let at = |e: session::SessionError| {
                Failure::new(1, format!("checkpoint {}: {e}", dir.display()))
            };
            session.load_parameters(&ck.parameters).map_err(at)?;
            session
                .load_optimizer_state(&ck.optimizer_state)
                .map_err(at)?;
            // AdamW's step number, where it is an input: the updates the checkpoint made.
            session.set_updates_done(ck.info.step);
            Some(ck.info)
        }
        None => None,
    };
    let start = resumed.as_ref().map_or(0, |r| r.step);
    let per_epoch = source.as_ref().map(|s| s.batches_per_epoch());
    let last = match (a.steps, a.epochs, per_epoch) {
        (s, Some(e), Some(p)) => {
            Some(s.map_or(e.saturating_mul(p), |s| s.min(e.saturating_mul(p))))
        }
        (s, _, _) => s,
    };
    let precision = session.precision().name().to_string();
    if !a.json {
        let params: usize = session.parameters().values().map(|t| t.numel()).sum();
        crate::outln!(
            "model {}: {} parameters, {} on {}{}, {} parameters, {}",
            session.model(),
            params,
            match (last, a.epochs) {
                (_, Some(e)) => format!("{e} epochs ({} steps)", last.unwrap_or(0)),
                (Some(s), None) => format!("{s} steps"),
                (None, None) => "? steps".into(),
            },
            session.exe().device(),
            match (device, session.precision()) {
                (_, ingot_compiler::precision::Precision::Bf16) => " (bf16 mixed precision)",
                (session::Device::Cuda(_), ingot_compiler::precision::Precision::Tf32) => {
                    " (tf32 matmuls)"
                }
                (session::Device::Cuda(_), _) => " (strict f32)",
                (session::Device::Cpu, _) => "",
            },
            if a.resume.is_some() {
                "resumed"
            } else if a.init.is_some() {
                "loaded"
            } else if file_weights {
                "the model file's"
            } else {
                "seeded"
            },
            match (&dataset, per_epoch) {
                (Some(d), Some(p)) => format!("{d}, {p} batches an epoch"),
                _ if a.data.is_some() => "loaded batch".into(),
                _ => "synthetic batch".into(),
            },
        )?;
        if let Some(r) = &resumed {
            crate::outln!(
                "resuming after step {} (epoch {}) from {}",
                r.step,
                r.epoch,
                a.resume.as_deref().map(Path::display).expect("resumed")
            )?;
        }
    }
    if let Some(s) = &source {
        let d = s.dropped_per_epoch();
        if d.count > 0 {
            let text = format!(
                "each epoch leaves out the last {} {} (a partial batch is dropped)",
                d.count, d.unit
            );
            if a.json {
                eprintln!("ingot: {text}");
            } else {
                crate::outln!("{text}")?;
            }
        }
    }
    // On a terminal (and without --json), a progress bar on stdout below the step lines;
    // otherwise the lines alone, unchanged.
    let bar = (!a.json && std::io::stdout().is_terminal()).then(|| {
        let bar = ProgressBar::with_draw_target(last, ProgressDrawTarget::stdout());
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30.cyan/blue} step {pos}/{len}  {msg}  [{elapsed_precise}, ETA {eta}]",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_position(start);
        bar.reset_eta();
        bar
    });
    let units = source.as_ref().map(|s| {
        let tokens = matches!(
            datasets::dataset_kind(a.dataset.as_deref().expect("given")),
            Ok(datasets::DatasetKind::Tokens)
        );
        let x = s.x();
        if tokens {
            ("tokens", x.dims.iter().product())
        } else {
            ("samples", x.dims.first().copied().unwrap_or(0))
        }
    });
    let scheduled = a.schedule != Decay::Constant || a.warmup > 0;
    let schedule = match (scheduled, session.has_lr_scale()) {
        (true, false) => {
            return Err(Failure::new(
                1,
                "this step has no learning-rate scale input for --schedule/--warmup: compile it with `ingot compile ... --lr-scale-input`",
            ))
        }
        (true, true) => {
            if !(0.0..=1.0).contains(&a.min_lr_ratio) {
                return Err(Failure::new(
                    2,
                    format!("--min-lr-ratio must be in [0, 1], not {}", a.min_lr_ratio),
                ));
            }
            let total = last.ok_or_else(|| {
                Failure::new(2, "a schedule needs the run's length: give --steps or --epochs")
            })?;
            Some(Schedule {
                decay: a.schedule,
                warmup: a.warmup,
                total,
                min_ratio: a.min_lr_ratio,
            })
        }
        (false, _) => None,
    };
    let record = RunRecord {
        model: session.model().to_string(),
        device: session.exe().device(),
        dataset: dataset.clone(),
        planned_bytes: planned_total(session),
        eval_layout: session.shared_layout(),
        ..Default::default()
    };
    let mut run = Run {
        a,
        record,
        eval,
        val_loss: None,
        evaluated_at: None,
        schedule,
        precision,
        step: start,
        last,
        units,
        dataset,
        dataset_fingerprint,
        optimizer,
        shuffle_seed,
        bar,
        planned: human(planned_total(session)),
        seconds: Vec::new(),
        wall: Vec::new(),
        free_after_first: None,
        non_finite: None,
        skipped: 0,
        epoch_loss: (0.0, 0),
        last_done: Instant::now(),
    };
    let mut last_info = None;
    match source {
        None => {
            while !run.done() {
                run.before_step(session)?;
                let r = session.step()?;
                if run.after_step(session, r, None)? == Next::Stop {
                    break;
                }
            }
        }
        Some(source) => {
            let mut epochs = Epochs::new(source);
            if let Some(e) = a.epochs {
                epochs = epochs.epochs(e);
            }
            if let Some(p) = resumed.as_ref().and_then(|r| r.position) {
                epochs.restore(p).map_err(|e| {
                    Failure::new(
                        1,
                        format!(
                            "checkpoint {}: {e}",
                            a.resume.as_deref().map(Path::display).expect("resumed")
                        ),
                    )
                })?;
            }
            let slots = session.input_slots()?;
            last_info = match session.cuda() {
                Some(c) => {
                    let mut buffers = Vec::with_capacity(2);
                    for _ in 0..2 {
                        buffers.push(Staging {
                            x: c.pinned_buffer(slots[0].1)?,
                            y: c.pinned_buffer(slots[1].1)?,
                        });
                    }
                    let buffers: [_; 2] = buffers.try_into().ok().expect("two");
                    over_data(session, &mut run, epochs, buffers, &slots)?
                }
                None => {
                    let buffers = [0, 1].map(|_| Staging {
                        x: vec![0u8; slots[0].1],
                        y: vec![0u8; slots[1].1],
                    });
                    over_data(session, &mut run, epochs, buffers, &slots)?
                }
            };
        }
    }
    if run.non_finite.is_none() && !run.seconds.is_empty() {
        run.evaluate(session)?;
    }
    run.measure_memory(session)?;
    if let Some(path) = &a.report {
        super::write_file(path, ingot_trainer::report::html(&run.record).as_bytes())?;
    }
    let bar = run.bar.take();
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    summary(
        a,
        session,
        &run.seconds,
        &run.wall,
        run.free_after_first.as_deref(),
        run.non_finite.as_ref().map(|(i, _)| *i),
        a.dataset
            .as_ref()
            .and_then(|_| session.input_slots().ok())
            .map(|s| 2 * (s[0].1 + s[1].1)),
    )?;
    if let Some((step, what)) = run.non_finite {
        // The parameters were updated with a non-finite gradient: nothing is saved over a
        // good file (nor a checkpoint), and the exit code says the run failed.
        return Err(Failure::new(
            1,
            format!(
                "step {step}: {what}; training stopped at the first non-finite loss or gradient norm{} (lower the learning rate, or check the data and the initial parameters; --skip-nonfinite goes on past such steps)",
                kept_files(a)
            ),
        ));
    }
    if let Some(path) = a.save.as_ref().filter(|_| writes_files(session)) {
        // A finite loss does not make finite weights: the update after it can overflow (a
        // learning rate too large, the gradient of sqrt at 0). Nothing non-finite is written.
        let mut params = session.parameters();
        // An imported model's file is a whole PyTorch state_dict: running statistics and
        // batch counts too, so that `load_state_dict` takes it back.
        if let Some(sd) = &state_dict {
            params.extend(sd.extra(session, run.step));
        }
        checkpoint::check_finite("parameter", &params).map_err(|e| {
            Failure::new(
                1,
                format!(
                    "after step {}: {e}{} (lower the learning rate, or check the data and the initial parameters)",
                    run.step,
                    kept_files(a)
                ),
            )
        })?;
        io::save(path, &params)?;
        if !a.json {
            crate::outln!(
                "saved the parameters{} to {}",
                if state_dict.is_some() {
                    " and running statistics (a PyTorch state_dict)"
                } else {
                    ""
                },
                path.display()
            )?;
        }
    }
    if let Some(dir) = &a.checkpoint {
        if !run.seconds.is_empty() || a.resume.is_none() {
            run.save_checkpoint(dir, session, last_info)?;
            if !a.json {
                crate::outln!("saved checkpoint at step {} in {}", run.step, dir.display())?;
            }
        }
    }
    Ok(())
}

/// What a failed run leaves as it was, for its error message: `--save`'s file not written, the
/// last checkpoint kept.
fn kept_files(a: &StepArgs) -> String {
    let mut kept = Vec::new();
    if let Some(p) = &a.save {
        kept.push(format!("{} was not written", p.display()));
    }
    if let Some(d) = &a.checkpoint {
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

/// The step loop over a data set: a loader thread fills `buffers` in turn, each batch goes
/// straight into the input slots (`slots`), and the staged batch is handed back only after
/// its step (and so its copy) finished. Returns the last batch's info.
fn over_data<B>(
    session: &mut Session,
    run: &mut Run<'_>,
    epochs: Epochs<Box<dyn BatchSource>>,
    buffers: [Staging<B>; 2],
    slots: &[(NodeId, usize); 2],
) -> Result<Option<BatchInfo>, Failure>
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

/// The last `--json` line: what the run measured, beside what was planned.
#[derive(serde::Serialize)]
struct Summary {
    device: String,
    /// Steps run (fewer than asked when a non-finite loss stopped the run).
    steps: u64,
    /// The step whose loss was NaN or infinite, where training stopped; absent when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    non_finite_loss_step: Option<u64>,
    median_step_seconds: Option<f64>,
    median_wall_seconds: Option<f64>,
    /// The plan's total: the one allocation's size, reported before launch (with --val, the
    /// total of the training and validation steps together).
    planned_bytes: usize,
    resident_bytes: usize,
    /// The training step's slab.
    slab_bytes: usize,
    /// With --val: how the one allocation divides between the two steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    eval: Option<ingot_compiler::plan::shared::SharedLayout>,
    /// GPU only: the drop in free device memory the allocation caused.
    measured_bytes: Option<usize>,
    /// GPU only: device memory in use before the allocation (CUDA context, cuBLAS, kernels).
    context_bytes: Option<usize>,
    /// GPU only: device memory the captured step graph took.
    graph_bytes: Option<usize>,
    /// GPU only: free device memory after the last step minus after the first (0: the steps
    /// allocated nothing).
    free_change_bytes: Option<i64>,
    /// Several GPUs: each GPU's change in free memory, rank 0 first (`free_change_bytes` is
    /// rank 0's).
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks_free_change_bytes: Option<Vec<i64>>,
    /// Data set runs: the loader's two staging buffers of x and y (page-locked on the GPU),
    /// allocated once before the first step.
    #[serde(skip_serializing_if = "Option::is_none")]
    staging_bytes: Option<usize>,
}

/// Whether this process writes the run's files (--save, checkpoints): every run but the
/// processes of a job other than rank 0, whose parameters are rank 0's bits.
fn writes_files(session: &Session) -> bool {
    session.exe().data_shard().is_none_or(|(rank, _)| rank == 0)
}

/// Free device memory on each GPU the session runs on, rank 0 first (`None` on the CPU).
fn free_on_gpus(session: &Session) -> Result<Option<Vec<usize>>, Failure> {
    let gpus = session.cuda_ranks();
    if gpus.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        gpus.into_iter()
            .map(CudaStep::free_memory)
            .collect::<Result<Vec<_>, _>>()?,
    ))
}

/// The one allocation's planned size: the training step's plan total, or with a validation
/// step, the two steps' shared total.
fn planned_total(session: &Session) -> usize {
    session
        .shared_layout()
        .map_or(session.exe().plan().total_bytes, |l| l.total_bytes)
}

fn median(xs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn summary(
    a: &StepArgs,
    session: &Session,
    seconds: &[f64],
    wall: &[f64],
    free_after_first: Option<&[usize]>,
    non_finite_loss_step: Option<u64>,
    staging_bytes: Option<usize>,
) -> Result<(), Failure> {
    let plan = session.exe().plan();
    let cuda = session.cuda();
    let mem = cuda.map(|c| c.memory());
    // Per GPU: free memory now minus after the first step.
    let changes: Option<Vec<i64>> = match (free_on_gpus(session)?, free_after_first) {
        (Some(now), Some(first)) => Some(
            now.iter()
                .zip(first)
                .map(|(&n, &f)| n as i64 - f as i64)
                .collect(),
        ),
        _ => None,
    };
    let free_change = changes.as_ref().and_then(|c| c.first().copied());
    let ranks_free_change = changes.filter(|c| c.len() > 1);
    let s = Summary {
        device: session.exe().device(),
        steps: seconds.len() as u64,
        non_finite_loss_step,
        median_step_seconds: median(seconds),
        median_wall_seconds: median(wall),
        planned_bytes: planned_total(session),
        resident_bytes: plan.resident_bytes,
        slab_bytes: plan.slab_bytes,
        eval: session.shared_layout(),
        measured_bytes: mem.map(|m| m.allocation),
        context_bytes: mem.map(|m| m.before_allocation),
        graph_bytes: mem.map(|m| m.graph),
        free_change_bytes: free_change,
        ranks_free_change_bytes: ranks_free_change.clone(),
        staging_bytes,
    };
    if a.json {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            summary: &'a Summary,
        }
        let line = serde_json::to_string(&Line { summary: &s })
            .map_err(|e| Failure::new(1, e.to_string()))?;
        return crate::outln!("{line}");
    }
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    if let (Some(m), Some(w)) = (median(seconds), median(wall)) {
        crate::outln!(
            "median step {:.3} ms over {} steps ({:.3} ms wall clock, with launch and the loss's copy)",
            m * 1e3,
            seconds.len(),
            w * 1e3
        )?;
    }
    match s.eval {
        None => crate::outln!(
            "memory planned: {:.1} MiB ({:.1} MiB resident + {:.1} MiB slab), one allocation{}",
            mib(s.planned_bytes),
            mib(s.resident_bytes),
            mib(s.slab_bytes),
            match session.exe().data_ranks() {
                1 => String::new(),
                n => format!(" per rank, on each of {n} ranks"),
            }
        )?,
        Some(l) => crate::outln!(
            "memory planned: {:.1} MiB, one allocation; {}",
            mib(s.planned_bytes),
            ingot_trainer::eval::layout_line(&l)
        )?,
    }
    if let Some(b) = staging_bytes {
        crate::outln!(
            "data staging: {:.2} MiB of host memory{} in two buffers, allocated once",
            mib(b),
            if cuda.is_some() { " (page-locked)" } else { "" }
        )?;
    }
    if let Some(m) = mem {
        crate::outln!(
            "memory measured on the GPU: {:.1} MiB taken by the allocation (asked {:.1} MiB; the driver rounds up to its page)",
            mib(m.allocation),
            mib(m.requested)
        )?;
        crate::outln!(
            "CUDA context, cuBLAS and kernels (not the step's): {:.1} MiB; step graph: {:.1} MiB",
            mib(m.before_allocation),
            mib(m.graph)
        )?;
    }
    if let Some(c) = &ranks_free_change {
        crate::outln!(
            "free device memory after step 1 and after step {}, on each of {} GPUs: {}",
            seconds.len(),
            c.len(),
            if c.iter().all(|&d| d == 0) {
                "identical (no allocation during the steps)".to_string()
            } else {
                format!("changed by {c:?} bytes")
            }
        )?;
    } else if let Some(d) = free_change {
        crate::outln!(
            "free device memory after step 1 and after step {}: {}",
            seconds.len(),
            if d == 0 {
                "identical (no allocation during the steps)".to_string()
            } else {
                format!("changed by {d} bytes")
            }
        )?;
    }
    Ok(())
}
