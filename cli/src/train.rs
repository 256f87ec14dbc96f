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
//! and position in the data to the same end; its schedule (`--schedule`, `--warmup`,
//! `--min-lr-ratio`) and `--clip-grad-norm` default to the checkpoint's, and flags that differ
//! from the checkpoint's are applied and said. On the CPU its losses are the uninterrupted
//! run's, bit for bit (`tests/train_data.rs`).
//!
//! The run itself is the trainer's ([`ingot_trainer::run::train`]); this module turns the flags
//! into its options and prints what it reports ([`printer::Printer`], an observer of the run).
//! `ingot run` trains a step executable through the same [`train`] function, so the two print
//! the same lines. On a terminal (stdout, no `--json`) a progress bar shows the epoch, step,
//! last loss, throughput and ETA; elsewhere only the plain lines are printed.

use crate::failure::Failure;
use ingot_runtime::cpu::threads;
use ingot_runtime::cuda::CudaOptions;
use ingot_trainer::data::images::ImageOptions;
use ingot_trainer::data::Order;
use ingot_trainer::eval::Evaluator;
use ingot_trainer::gpt_names;
use ingot_trainer::run::{RunError, RunOptions};
use ingot_trainer::schedule::Decay;
use ingot_trainer::session::{self, Session};
use ingot_trainer::{checkpoint, datasets};
use std::path::{Path, PathBuf};

mod printer;

pub use super::device::Device;

/// How batches are drawn from a data set.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DataOrder {
    /// Token rows at random offsets (nanoGPT's get_batch); samples reshuffled every epoch.
    #[default]
    Shuffled,
    /// Token rows in file order (llm.c's loader); samples in file order.
    Sequential,
}

/// `--dataset-format`: how a data set file is read ([`datasets::DatasetFormat`]).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DatasetFormatArg {
    /// As the file's first bytes say (a safetensors header, the .npy magic, an llm.c magic
    /// number, else raw uint16 tokens; a directory of folders and no x.npy or y.npy is an image
    /// folder, any other directory a sample set of x.npy and y.npy).
    #[default]
    Auto,
    /// Raw little-endian uint16 tokens, whatever the first bytes look like.
    Raw,
    /// An llm.c token shard.
    Llmc,
    /// A 1-D .npy of tokens (a directory: x.npy and y.npy samples).
    Npy,
    /// A safetensors file of samples x and y.
    Safetensors,
    /// A directory of class folders of JPEG/PNG images (torchvision's ImageFolder layout).
    Images,
}

impl From<DatasetFormatArg> for datasets::DatasetFormat {
    fn from(f: DatasetFormatArg) -> Self {
        match f {
            DatasetFormatArg::Auto => datasets::DatasetFormat::Auto,
            DatasetFormatArg::Raw => datasets::DatasetFormat::Raw,
            DatasetFormatArg::Llmc => datasets::DatasetFormat::LlmC,
            DatasetFormatArg::Npy => datasets::DatasetFormat::Npy,
            DatasetFormatArg::Safetensors => datasets::DatasetFormat::Safetensors,
            DatasetFormatArg::Images => datasets::DatasetFormat::Images(Default::default()),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: crate::model_args::ModelArgs,
    #[command(flatten)]
    pub run: StepArgs,
    /// Keep attention as the plain math it is written in (scores, softmax, ·v) instead of
    /// replacing it by the fused attention op (for comparisons).
    #[arg(long = "no-fuse-attention")]
    pub no_fuse_attention: bool,
    /// No gradient clipping: what a run resumed from a checkpoint that clipped
    /// (`--clip-grad-norm`) says to turn it off (a resumed run otherwise clips as its
    /// checkpoint's run did); without --resume, the default.
    #[arg(long = "no-clip-grad-norm", conflicts_with = "clip_grad_norm")]
    pub no_clip_grad_norm: bool,
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
    #[arg(long, value_parser = crate::numbers::count)]
    pub steps: Option<u64>,
    /// With --dataset: the number of epochs (passes over the data set), counted from the
    /// run's start.
    #[arg(long, requires = "dataset", value_parser = crate::numbers::positive_count)]
    pub epochs: Option<u64>,
    /// Where to run the steps (train: cpu unless given; run: the executable's target).
    #[arg(long, value_enum)]
    pub device: Option<Device>,
    /// On the CPU: the threads every kernel runs on (default: INGOT_THREADS if set, else the
    /// machine's cores). Results are the same bits for any count. With an image folder, on any
    /// device, also the threads that decode and augment its images (the same batches for any
    /// count).
    #[arg(long, value_name = "N", value_parser = crate::numbers::positive_count)]
    pub threads: Option<u64>,
    /// Initial parameters (safetensors, PyTorch names and layouts) instead of seeded ones. A
    /// GPT also reads GPT-2 weights under Hugging Face's names (transformers' GPT2LMHeadModel
    /// or GPT2Model) or nanoGPT's, recognised by the names.
    #[arg(long, value_name = "P.safetensors", conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// One fixed batch (safetensors holding x and y), trained on at every step, instead of a
    /// synthetic one.
    #[arg(long, value_name = "B.safetensors", conflicts_with = "dataset")]
    pub data: Option<PathBuf>,
    /// A data set read batch by batch over epochs: a token stream for a language model (raw
    /// uint16 as nanoGPT's train.bin, an llm.c shard, a 1-D .npy; `ingot data bytes` makes one
    /// from any text) or samples for a classifier (a directory holding x.npy and y.npy, or a
    /// safetensors file holding x and y), or an image folder for an image classifier (one
    /// folder of .jpg/.jpeg/.png images per class, torchvision's ImageFolder layout: class ids
    /// in sorted folder order; shuffled, random-resized-cropped and flipped each epoch, resized
    /// and center-cropped for --val or --order sequential; normalised by --image-mean and
    /// --image-std; an unreadable image is skipped with a warning and counted). A final
    /// partial batch of each epoch is dropped.
    #[arg(long, value_name = "PATH")]
    pub dataset: Option<PathBuf>,
    /// With --dataset: shuffled (token rows at random offsets, samples reshuffled each epoch)
    /// or sequential (file order).
    #[arg(long, value_enum, default_value_t = DataOrder::Shuffled, requires = "dataset")]
    pub order: DataOrder,
    /// With --dataset (and --val): how the files are read. auto detects the format from the
    /// first bytes and, when that reading fails, says what it took the file for.
    #[arg(long = "dataset-format", value_enum, default_value_t = DatasetFormatArg::Auto, requires = "dataset")]
    pub dataset_format: DatasetFormatArg,
    /// With an image folder: the per-channel mean R,G,B subtracted from pixels in [0, 1]
    /// (one value: all three; a one-channel model takes their average).
    #[arg(long = "image-mean", value_name = "R,G,B", default_value = "0.485,0.456,0.406", value_parser = crate::numbers::image_mean, requires = "dataset")]
    pub image_mean: [f32; 3],
    /// With an image folder: the per-channel standard deviation R,G,B that pixels are divided
    /// by after the mean is subtracted.
    #[arg(long = "image-std", value_name = "R,G,B", default_value = "0.229,0.224,0.225", value_parser = crate::numbers::image_std, requires = "dataset")]
    pub image_std: [f32; 3],
    /// With --dataset: the seed of the shuffle or of the random offsets (default: --seed).
    #[arg(long = "shuffle-seed", requires = "dataset")]
    pub shuffle_seed: Option<u64>,
    /// Write checkpoints into this directory (the weights and optimizer state as safetensors,
    /// and checkpoint.json), every --checkpoint-every steps and at the end of the run.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// With --checkpoint: save every N steps (default: only at the end).
    #[arg(long = "checkpoint-every", value_name = "N", requires = "checkpoint", value_parser = crate::numbers::positive_count)]
    pub checkpoint_every: Option<u64>,
    /// Continue the run saved in this checkpoint directory: give the same model, data set and
    /// --steps/--epochs as the run that wrote it.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Keep going after a step whose loss, gradient norm or updated parameters are NaN or
    /// infinite (the step counts its parameters' non-finite values each step), logging it
    /// (default: stop there, naming the step and the parameter, with the last checkpoint
    /// kept). The step's update is NOT undone: it
    /// runs inside the compiled step and has been applied when the loss is seen, so parameters
    /// it made non-finite stay so; prefer resuming from the last checkpoint with a lower
    /// learning rate.
    #[arg(long = "skip-nonfinite")]
    pub skip_nonfinite: bool,
    /// Write the parameters after the last step here.
    #[arg(long, value_name = "P.safetensors")]
    pub save: Option<PathBuf>,
    /// With --save, for a GPT: write the weights under Hugging Face's names and layouts
    /// (transformers' GPT2LMHeadModel: `transformer.h.N...`, Conv1D weights [in, out]) or
    /// nanoGPT's, for `from_pretrained`/`load_state_dict` there (--init recognises both by
    /// their names).
    #[arg(long, value_enum, requires = "save")]
    pub names: Option<NamesArg>,
    /// The device's peak in TFLOP/s that each step's FLOP rate is shown as a fraction of,
    /// instead of the table's (H200 and H100 SXM: 989.4 bf16, 494.7 tf32, 66.9 f32; A100:
    /// 312, 156, 19.5; dense, NVIDIA's published figures). A device the table does not name
    /// (the CPU among them) shows its rate with no fraction unless this is given.
    #[arg(long = "peak-tflops", value_name = "X", value_parser = crate::numbers::positive)]
    pub peak_tflops: Option<f64>,
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
    pub precision: crate::precision_args::PrecisionArgs,
    /// A validation set (of the same kind as --dataset): its loss under the current parameters
    /// is computed by a forward-only step every --eval-every steps (default: at the end of each
    /// epoch) and at the end of the run (`ingot train` only).
    #[arg(long, value_name = "PATH", requires = "dataset")]
    pub val: Option<PathBuf>,
    /// With --val: evaluate every N steps.
    #[arg(long = "eval-every", value_name = "N", requires = "val", value_parser = crate::numbers::positive_count)]
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
    /// --min-lr-ratio times it at the run's last step (default: constant). Any schedule (or
    /// --warmup) compiles the step with a learning-rate scale input that the host writes before
    /// each step. A resumed run without it goes on with the checkpoint's schedule, and with it
    /// says what changed.
    #[arg(long, value_enum)]
    pub schedule: Option<DecayArg>,
    /// Steps of linear warmup: step i (from 0) runs at (i + 1) / (N + 1) of the rate (default
    /// 0; a resumed run's default is its checkpoint's).
    #[arg(long, value_name = "N", value_parser = crate::numbers::count)]
    pub warmup: Option<u64>,
    /// The schedule's final learning rate as a fraction of the optimizer's, e.g. 0.1 (default
    /// 0; a resumed run's default is its checkpoint's).
    #[arg(long = "min-lr-ratio", value_name = "R", allow_hyphen_values = true, value_parser = crate::numbers::unit)]
    pub min_lr_ratio: Option<f64>,
}

/// Sets the CPU executor's thread count for the process: `given` (--threads), else
/// INGOT_THREADS (a test harness running many commands at once sets 1), else every core. The
/// executor is made deep inside the session, so the count is the process's default, set once.
pub(crate) fn set_cpu_threads(given: Option<u64>) -> Result<(), Failure> {
    let n = match given {
        Some(n) => n as usize,
        None if std::env::var_os("INGOT_THREADS").is_some() => threads::default_threads(),
        None => threads::machine_threads(),
    };
    if n > threads::MAX_THREADS {
        return Err(Failure::new(
            2,
            format!("--threads {n}: give at most {}", threads::MAX_THREADS),
        ));
    }
    threads::set_default_threads(n);
    Ok(())
}

impl StepArgs {
    /// How image folders are read: --image-mean and --image-std, and the threads that decode
    /// them (--threads, else INGOT_THREADS, else every core); with a new log of skipped files,
    /// to be shared by the training and the validation folder.
    pub fn image_options(&self) -> ImageOptions {
        let threads = match self.threads {
            Some(n) => n as usize,
            None if std::env::var_os("INGOT_THREADS").is_some() => threads::default_threads(),
            None => 0,
        };
        ImageOptions {
            mean: self.image_mean,
            std: self.image_std,
            threads,
            ..Default::default()
        }
    }

    /// `--dataset-format` for the data set at `path`, an image folder read with `images`
    /// ([`datasets::with_image_options`]).
    pub fn format_for(
        &self,
        path: Option<&Path>,
        images: &ImageOptions,
    ) -> datasets::DatasetFormat {
        let format = self.dataset_format.into();
        match path {
            Some(path) => datasets::with_image_options(format, path, images),
            None => format,
        }
    }

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
        crate::files::check_outputs(
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
                errln!(
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
            Device::Cpu => {
                set_cpu_threads(self.threads)?;
                Ok(session::Device::Cpu)
            }
            Device::Cuda => Ok(session::Device::Cuda(CudaOptions::default())),
        }
    }
}

/// `a.model`, with an ONNX model's labels' shape read off --data's `y` (for the class axis
/// of a cross-entropy on logits of more than two axes). A file that cannot be read is left to
/// the run, which names it.
fn with_labels_shape(a: &TrainArgs) -> crate::model_args::ModelArgs {
    let mut m = a.model.clone();
    if let (Some(_), Some(path)) = (&m.onnx.onnx, &a.run.data) {
        if let Ok(batch) = ingot_runtime::io::load(path) {
            m.onnx.import.labels_shape = batch.get("y").map(|y| y.ty.shape.dims().to_vec());
        }
    }
    m
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
        crate::output::set_quiet(env.rank != 0);
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
    // A resumed run's schedule and clipping default to its checkpoint's.
    let clip = match (a.model.clip_grad_norm, a.no_clip_grad_norm) {
        (Some(max), _) => Some(Some(max)),
        (None, true) => Some(None),
        (None, false) => None,
    };
    let training = a.run.training(clip)?;
    let scheduled = training.decay != Decay::Constant || training.warmup > 0;
    // AdamW's step number is an input the session counts, so the one compiled step serves a
    // resumed run too; the learning-rate scale input only where a schedule drives it.
    // An ONNX model's cross-entropy class axis may be decided by the shape of --data's y.
    let model_args = with_labels_shape(a);
    // One import of an --onnx file serves the compile and the session's weights.
    model_args.onnx.keep_import();
    let mut step_options = model_args.step_options(scheduled);
    step_options.step_input = true;
    step_options.clip_grad_norm = training.clip_grad_norm;
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
    let (model, compiled, _, fitted) = super::stages::load_and_compile(
        &model_args,
        &step_options,
        &opts,
        !a.run.json,
        super::stages::runs_offload(device.target(), step_options.ranks),
    )?;
    if let Some(f) = &fitted {
        if a.run.json {
            let line = serde_json::json!({ "fitted": f });
            outln!("{line}")?;
        } else {
            outln!("{}", f.line())?;
        }
    }
    let exe = compiled
        .executable(device.target())
        .map_err(|e| Failure::new(1, format!("lowering for {}: {e}", device.target())))?;
    // One log of skipped images for the training and the validation folder.
    let images = a.run.image_options();
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
            let eval = Evaluator::new_as(
                &session,
                val,
                a.run.eval_batches,
                a.run.seed,
                a.run.format_for(Some(val), &images),
            )
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
    let onnx_state_dict = model_args.onnx.load_weights(&mut session)?;
    let file_weights = onnx_state_dict.is_some();
    // Any other model with batch norms reads and writes a whole PyTorch state_dict too (running
    // statistics and num_batches_tracked beside the parameters), by the same mechanism.
    let state_dict = onnx_state_dict
        .or_else(|| ingot_trainer::state_dict::StateDict::of_running_stats(&session));
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
    let o = RunOptions {
        optimizer: Some(model.optimizer),
        clip_grad_norm: Some(training.clip_grad_norm),
        file_weights,
        state_dict,
        ..options(&a.run, &training, device, &images)
    };
    train_with(&mut session, &o, eval, a.run.json)
}

/// `--shard-optimizer` against what cannot go with it in a run, before anything compiles:
/// one process of a `--torchrun` job holds one rank's rows of each sharded weight, and
/// reading, saving or checkpointing the whole weight would need a collective the runtime does
/// not have. Then the number of ranks ([`crate::model_args::ModelArgs::check_shard_optimizer`]).
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

/// The run `a` asks for, as the trainer takes it, with the schedule of `training`
/// ([`StepArgs::training`]).
fn options(
    a: &StepArgs,
    training: &checkpoint::Training,
    device: session::Device,
    images: &ImageOptions,
) -> RunOptions {
    RunOptions {
        steps: a.steps,
        epochs: a.epochs,
        init: a.init.clone(),
        data: a.data.clone(),
        dataset: a.dataset.clone(),
        dataset_format: a.format_for(a.dataset.as_deref(), images),
        order: Some(match a.order {
            DataOrder::Shuffled => Order::Random,
            DataOrder::Sequential => Order::Sequential,
        }),
        shuffle_seed: a.shuffle_seed,
        checkpoint: a.checkpoint.clone(),
        checkpoint_every: a.checkpoint_every,
        resume: a.resume.clone(),
        skip_nonfinite: a.skip_nonfinite,
        save: a.save.clone(),
        save_data: a.save_data.clone(),
        seed: a.seed,
        eval_every: a.eval_every,
        report: a.report.clone(),
        schedule: training.decay,
        warmup: training.warmup,
        min_lr_ratio: training.min_lr_ratio,
        device,
        optimizer: None,
        clip_grad_norm: None,
        file_weights: false,
        state_dict: None,
        names: a.names.map(|n| match n {
            NamesArg::Hf => gpt_names::Naming::HuggingFace,
            NamesArg::Nanogpt => gpt_names::Naming::NanoGpt,
        }),
        peak_tflops: a.peak_tflops,
    }
}

/// `--names`: the naming `--save` writes a GPT under.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamesArg {
    /// Hugging Face's (transformers' GPT2LMHeadModel).
    Hf,
    /// nanoGPT's.
    Nanogpt,
}

impl StepArgs {
    /// `--steps` is needed unless `--dataset` with `--epochs` bounds the run.
    pub fn check_steps(&self) -> Result<(), Failure> {
        let training = checkpoint::Training::default();
        options(
            self,
            &training,
            session::Device::Cpu,
            &ImageOptions::default(),
        )
        .check_steps()
        .map_err(failure)
    }

    /// The run's schedule and gradient clipping (`clip_grad_norm`, the flags where the command
    /// has them: `Some(Some(max))` for `--clip-grad-norm MAX`, `Some(None)` for
    /// `--no-clip-grad-norm`): the flags given, and for a flag not given, the checkpoint's that
    /// `--resume` names (its record is read here, before the step is compiled: a schedule and
    /// clipping are compiled into the step), so a resumed run goes on as its checkpoint's run
    /// went.
    pub fn training(
        &self,
        clip_grad_norm: Option<Option<f64>>,
    ) -> Result<checkpoint::Training, Failure> {
        let given = checkpoint::GivenTraining {
            decay: self.schedule.map(Decay::from),
            warmup: self.warmup,
            min_lr_ratio: self.min_lr_ratio,
            clip_grad_norm,
        };
        let resumed = match &self.resume {
            Some(dir) => Some(checkpoint::read_info(dir).map_err(|e| Failure::new(1, e))?),
            None => None,
        };
        Ok(given.or_resumed(resumed.as_ref()))
    }
}

/// A run's error as the command line's failure: bad options exit with 2, a failure to print
/// with its own code, everything else with 1.
fn failure(e: RunError) -> Failure {
    match e {
        RunError::Usage(message) => Failure::new(2, message),
        RunError::Observer(e) => match e.downcast::<printer::Printing>() {
            Ok(p) => p.0,
            Err(e) => Failure::new(1, e.to_string()),
        },
        e => Failure::new(1, e.to_string()),
    }
}

/// Trains `session` as `a` says ([`ingot_trainer::run::train`]), printing each step's loss (a
/// line of text, or of JSON), then the summary. `ingot train` and `ingot run` both end here,
/// so their output is the same.
pub fn train(session: &mut Session, a: &StepArgs, device: session::Device) -> Result<(), Failure> {
    if a.val.is_some() {
        return Err(Failure::new(
            2,
            "--val needs the model's forward pass, which a step executable does not hold: evaluate with `ingot train`",
        ));
    }
    let training = a.training(None)?;
    let o = RunOptions {
        state_dict: ingot_trainer::state_dict::StateDict::of_running_stats(session),
        ..options(a, &training, device, &a.image_options())
    };
    train_with(session, &o, None, a.json)
}

/// Runs `o` in `session`, evaluating with `eval` (`--val`), printing lines or JSON. Callers
/// fill in what [`options`] cannot know from the flags: the step's optimizer, where known
/// (recorded in checkpoints and compared on resume); the `state_dict` that `--init` reads and
/// `--save` writes whole (running statistics and `num_batches_tracked` included); and
/// `file_weights`, when the session holds the weights of the model's file (an ONNX model's),
/// which `--init` or `--resume` replace.
fn train_with(
    session: &mut Session,
    o: &RunOptions,
    eval: Option<Evaluator>,
    json: bool,
) -> Result<(), Failure> {
    let mut printer = printer::Printer::new(json);
    ingot_trainer::run::train(session, o, eval, &mut printer).map_err(failure)
}

/// `--schedule`: the shape of the learning rate's decay after the warmup
/// ([`ingot_trainer::schedule::Decay`], named here for the command line).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DecayArg {
    /// The optimizer's learning rate throughout (after any warmup).
    #[default]
    Constant,
    /// Half a cosine from the full rate down to the minimum at the last step (nanoGPT's).
    Cosine,
    /// A straight line from the full rate down to the minimum at the last step.
    Linear,
}

impl From<DecayArg> for Decay {
    fn from(d: DecayArg) -> Decay {
        match d {
            DecayArg::Constant => Decay::Constant,
            DecayArg::Cosine => Decay::Cosine,
            DecayArg::Linear => Decay::Linear,
        }
    }
}
