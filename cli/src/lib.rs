//! The `ingot` command line: argument parsing, and one module per subcommand.
//!
//! Exit codes: 0 success; 1 an error (the message names what is wrong); 2 bad arguments;
//! 3 a memory budget the plan exceeds, or a capacity the offset solver cannot meet in time.

mod compile;
mod data;
mod device;
mod dsa;
mod eval;
mod generate;
mod gpus;
mod inspect;
pub mod numbers;
pub mod onnx;
mod plan;
mod run;
mod stages;
mod train;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "ingot",
    version,
    about = "Compile training steps into executables whose memory is planned before launch"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How a CUDA step's convolutions run, over INGOT_CONV: by default (auto) a bf16 step's
    /// are compiled channels-last where cuDNN loads and run through cuDNN (NCHW ones, such as
    /// a stem over 3 channels, and f32 and tf32 steps' as im2col + cuBLAS); `im2col` compiles
    /// them NCHW and runs them as im2col + cuBLAS GEMMs; `cudnn` compiles every precision
    /// channels-last and runs NCHW ones through cuDNN too.
    #[arg(long, global = true, value_enum, value_name = "PATH")]
    pub conv: Option<ConvName>,
}

/// The spellings of [`ingot_runtime::cuda::cudnn::ConvSetting`] on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvName {
    Auto,
    Cudnn,
    Im2col,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the memory report of a model's training step, before anything runs.
    #[command(mut_arg("model", |a| a.required_unless_present_any(["model_file", "onnx", "diff"])))]
    Plan(plan::PlanArgs),
    /// Train a model for some steps and print the loss of each.
    Train(Box<train::TrainArgs>),
    /// Compile a model's training step into a step executable file, planned for one target.
    Compile(compile::CompileArgs),
    /// Train a step executable made by `ingot compile`, as `ingot train` trains a model.
    Run(run::RunArgs),
    /// Print what a step executable holds: its header and its memory report.
    Inspect(inspect::InspectArgs),
    /// Solve an offset-assignment problem (MiniMalloc's CSV format) with Ingot's solver.
    Dsa(dsa::DsaArgs),
    /// Prepare data sets: `ingot data bytes INPUT OUT.bin` writes byte-level tokens.
    Data(data::DataArgs),
    /// ONNX models: `ingot onnx check MODEL.onnx` lists every node Ingot cannot import.
    Onnx(onnx::OnnxArgs),
    /// Evaluate trained weights on a data set: the loss, and a classifier's top-1 and top-5
    /// accuracy, by a forward-only planned step. With --checkpoint DIR, --model defaults to the
    /// model the checkpoint's run trained.
    #[command(mut_arg("model", |a| a.required_unless_present_any(["checkpoint"])))]
    Eval(Box<eval::EvalArgs>),
    /// Predict with trained weights: one CSV row per sample of a data set (index, predicted
    /// class, its probability, label). With --checkpoint DIR, --model defaults to the model the
    /// checkpoint's run trained.
    #[command(mut_arg("model", |a| a.required_unless_present_any(["checkpoint"])))]
    Predict(Box<eval::PredictArgs>),
    /// Generate text from a trained GPT or an imported ONNX decoder: prompts continued token by token.
    Generate(generate::GenerateArgs),
}

/// The precision a command compiles in: `--precision f32|tf32|bf16`, `--tf32` its alias for tf32.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct PrecisionArgs {
    /// f32 (the reference); tf32 (f32 storage, the GPU's matrix products on TF32 tensor
    /// cores); bf16 (mixed precision as PyTorch's bf16 autocast: bf16 matmul operands and
    /// activations, f32 parameters, gradients, optimizer state, reductions and loss).
    /// Default: f32, or what the executable was compiled in (`ingot run`).
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionName>,
    /// The same as --precision tf32.
    #[arg(long, conflicts_with = "precision")]
    pub tf32: bool,
}

/// The spellings of [`ingot_compiler::precision::Precision`] on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrecisionName {
    F32,
    Tf32,
    Bf16,
}

impl PrecisionArgs {
    /// The precision asked for, if any.
    pub fn given(&self) -> Option<ingot_compiler::precision::Precision> {
        use ingot_compiler::precision::Precision;
        if self.tf32 {
            return Some(Precision::Tf32);
        }
        self.precision.map(|p| match p {
            PrecisionName::F32 => Precision::F32,
            PrecisionName::Tf32 => Precision::Tf32,
            PrecisionName::Bf16 => Precision::Bf16,
        })
    }

    /// The precision to compile in: what was given, else `None` (the model's own: f32, or a
    /// model file's `precision` line). Refused where it means nothing: TF32 is a mode of the
    /// GPU's tensor cores, so `tf32` on the CPU is an error (a file's `tf32` on the CPU is
    /// refused when the step is lowered).
    pub fn for_device(
        &self,
        device: train::Device,
    ) -> Result<Option<ingot_compiler::precision::Precision>, Failure> {
        let p = self.given();
        if p == Some(ingot_compiler::precision::Precision::Tf32) && device == train::Device::Cpu {
            return Err(Failure::new(
                2,
                "tf32 applies to matmuls on the GPU; add --device cuda, or use --precision f32 or bf16",
            ));
        }
        Ok(p)
    }
}

/// Which model a command compiles: a named one (`--model`) or the IR text form of a forward
/// pass (`--model-file`), exactly one of the two; and the optimizer its step trains with, the
/// model's own unless changed here.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// mlp, gpt-mini, gpt2, gpt2-medium, gpt-1.3b, cnn, resnet18, gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=.., or resnet:depth=18|34|50|101|152,side=..,batch=..,classes=..,width=.. (torchvision's ResNets; side 224, batch 32, classes 1000, width 64 unless given)
    #[arg(
        long,
        required_unless_present_any = ["model_file", "onnx"],
        conflicts_with_all = ["model_file", "onnx"]
    )]
    pub model: Option<String>,
    /// A forward pass in Ingot's IR text form with a scalar output "loss" (e.g.
    /// docs/examples/tiny-mlp.ir), instead of --model. It trains with SGD, lr 0.1, unless the
    /// file has an `optimizer` line or --optimizer is given.
    #[arg(long = "model-file", value_name = "PATH", conflicts_with = "onnx")]
    pub model_file: Option<std::path::PathBuf>,
    /// An ONNX model instead of --model (see `ingot onnx`), with its loss and batch.
    #[command(flatten)]
    pub onnx: onnx::OnnxModelArgs,
    /// The optimizer: sgd, momentum (SGD with momentum) or adamw (default: the model's own:
    /// AdamW for the GPTs, SGD lr 0.1 for mlp and files). A new one starts from PyTorch's
    /// defaults for it (sgd/momentum: lr 0.1, momentum 0.9; adamw: lr 1e-3, betas 0.9,0.999,
    /// eps 1e-8, weight decay 0.01).
    #[arg(long, value_name = "NAME", value_parser = ["sgd", "momentum", "adamw"])]
    pub optimizer: Option<String>,
    /// Learning rate.
    #[arg(long, value_name = "LR", allow_hyphen_values = true, value_parser = numbers::positive)]
    pub lr: Option<f64>,
    /// Weight decay: decoupled for adamw (p *= 1 - lr * wd), added to the gradient for
    /// sgd/momentum (as torch.optim.SGD).
    #[arg(long = "weight-decay", value_name = "WD", allow_hyphen_values = true, value_parser = numbers::non_negative)]
    pub weight_decay: Option<f64>,
    /// AdamW's betas, B1,B2 (e.g. 0.9,0.95).
    #[arg(long, value_name = "B1,B2", allow_hyphen_values = true, value_parser = numbers::betas)]
    pub betas: Option<(f64, f64)>,
    /// The momentum of --optimizer momentum.
    #[arg(long, value_name = "M", allow_hyphen_values = true, value_parser = numbers::below_one)]
    pub momentum: Option<f64>,
    /// AdamW's eps.
    #[arg(long, value_name = "EPS", allow_hyphen_values = true, value_parser = numbers::positive)]
    pub eps: Option<f64>,
    /// Clip the gradients by their global L2 norm inside the step, as PyTorch's
    /// clip_grad_norm_ (the norm, before clipping, is logged each step).
    #[arg(long = "clip-grad-norm", value_name = "MAX", allow_hyphen_values = true, value_parser = numbers::positive)]
    pub clip_grad_norm: Option<f64>,
    /// Data parallelism over N ranks: the step averages its gradients over the ranks with
    /// all-reduces in buckets of about 25 MiB (the plan shows them). 1 (the default) is the
    /// single-device step exactly.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub ranks: u64,
    /// Gradient accumulation: the step runs K micro-batches of batch/K samples, one after
    /// another (each forward pass followed by its backward pass), sums their gradients and
    /// updates once: the whole batch's step for a mean loss (batch norm normalises each
    /// micro-batch by its own statistics, as in PyTorch), in about one micro-batch's activation
    /// memory. K must divide the model's batch; needs --model NAME. Given (even as 1), it is
    /// kept: --budget then only checks the plan.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub accumulate: Option<u64>,
    /// Memory budget (e.g. 16GiB, 512MiB, 1000000): the step is compiled to fit it. Over it,
    /// matmul and attention outputs are recomputed for the backward pass (cheapest FLOPs per
    /// byte first), and a named model accumulates gradients over the fewest micro-batches that
    /// fit, with recomputation where that adds at most 33% FLOPs (the report says what was
    /// done); what cannot fit exits with code 3 naming the smallest plan found and what is
    /// live at its peak, or the resident bytes when they alone are over. With --accumulate
    /// given (1 for none) it is a gate only.
    #[arg(long, value_parser = numbers::size)]
    pub budget: Option<usize>,
    /// Compute and differentiate the loss head in row chunks: a head whose largest value (a
    /// language model's [tokens, vocab] logits and their softmax) is over 512 MiB runs a block
    /// of rows at a time, each block's backward pass right after its forward pass, so only one
    /// block's logits live. Lowers the peak by most of the logits; costs an addition of the
    /// head's weight gradient per extra block.
    #[arg(long)]
    pub chunk_loss_head: bool,
    /// With several ranks: all-reduce the gradients computed in bf16 (a bf16 matmul's weight
    /// gradients, with --precision bf16) in bf16, before they are widened to f32 for the
    /// update: half the bytes on the wire, each mean rounded to bf16 (PyTorch DDP's
    /// bf16_compress_hook). Off by default.
    #[arg(long)]
    pub reduce_in_bf16: bool,
    /// With --precision bf16: cast the weights to bf16 in every forward pass, as autocast
    /// does, instead of keeping bf16 copies that the update writes (the default). Two bytes a
    /// weight less resident memory, for the casts' time in each step (gpt2: 247 MB less, about
    /// 2% slower). --budget drops the copies by itself before anything else
    #[arg(long)]
    pub no_weight_copies: bool,
    /// With several ranks: the size of the gradient buckets each all-reduce takes (e.g.
    /// 10MiB; default 25MiB, as PyTorch DDP's bucket_cap_mb). Smaller buckets start their
    /// all-reduces earlier in the backward pass and leave less of it to wait for at the end,
    /// in more collectives.
    #[arg(long, value_name = "SIZE", value_parser = parse_bucket_size)]
    pub bucket_size: Option<usize>,
    /// Shard the optimizer over the ranks (ZeRO stage 1): each rank keeps and updates only its
    /// rows of each bf16-copied weight and of its AdamW moments; their gradients are
    /// reduce-scattered instead of all-reduced, and the new bf16 copies all-gathered. Less
    /// memory per rank (the plan shows it), the same results as unsharded; parameters,
    /// --save and checkpoints stay whole. Needs two ranks or more (--ranks N or --gpus N, not
    /// --torchrun), --precision bf16 with its weight copies (no --no-weight-copies), and no
    /// --clip-grad-norm.
    #[arg(long)]
    pub shard_optimizer: bool,
}

fn parse_bucket_size(v: &str) -> Result<usize, String> {
    match numbers::size(v)? {
        0 => Err("a gradient bucket must hold at least one byte".into()),
        n => Ok(n),
    }
}

impl ModelArgs {
    /// What the training step computes besides gradients and update: the count of non-finite
    /// parameters after the update (always: a run stops at the step that makes one), gradient
    /// clipping as asked, and, when `inputs`, a learning-rate scale input (a schedule will drive it) and
    /// AdamW's step number as an input (the host counts steps; a resumed run passes its own).
    pub fn step_options(&self, inputs: bool) -> ingot_compiler::autodiff::StepOptions {
        ingot_compiler::autodiff::StepOptions {
            lr_scale: inputs,
            clip_grad_norm: self.clip_grad_norm,
            step_input: inputs,
            ranks: self.ranks as usize,
            accumulate: self.accumulate.unwrap_or(1) as usize,
            loss_head_chunk_bytes: if self.chunk_loss_head {
                ingot_compiler::autodiff::chunk::HEAD_CHUNK_BYTES
            } else {
                0
            },
            reduce_in_bf16: self.reduce_in_bf16,
            bucket_bytes: self.bucket_size.unwrap_or(0),
            cast_weights_each_step: self.no_weight_copies,
            shard_optimizer: self.shard_optimizer,
            count_nonfinite: true,
        }
    }

    /// `--shard-optimizer` against the `ranks` the step is compiled for (`--ranks N` or
    /// `--gpus N`), checked before anything compiles: a clear error naming the flags, where the
    /// compiler's own refusal would only say "ranks". Its other needs (bf16 weight copies, no
    /// clipping) are the compiler's to check, and its refusals name those flags.
    pub fn check_shard_optimizer(&self, ranks: u64) -> Result<(), Failure> {
        if self.shard_optimizer && ranks < 2 {
            return Err(Failure::new(
                2,
                format!(
                    "--shard-optimizer divides the optimizer among the ranks and needs two or \
                    more; the step is compiled for {ranks}: add --ranks N (CPU) or --gpus N"
                ),
            ));
        }
        Ok(())
    }
}

/// A model's batch: the first dimension of its input `x`.
fn model_batch(m: &ingot_compiler::model::Model) -> Option<usize> {
    let x = m.graph.leaf("x")?;
    m.graph.ty(x).shape.dims().first().copied()
}

impl ModelArgs {
    /// The files the model is read from, for [`check_outputs`].
    pub fn input_files(&self) -> [(&'static str, Option<&std::path::Path>); 2] {
        [
            ("--model-file", self.model_file.as_deref()),
            ("--onnx", self.onnx.onnx.as_deref()),
        ]
    }

    /// Builds the model: by name, or read and parsed from the file (errors name the file).
    pub fn load(&self) -> Result<ingot_compiler::model::Model, Failure> {
        self.load_at(None, self.accumulate.unwrap_or(1) as usize)
    }

    /// The model at batch `batch` (a named model or `gpt:` spec; a model file's batch is fixed
    /// in its text), with the optimizer settings as [`ModelArgs::load`] applies them.
    pub fn load_at_batch(&self, batch: usize) -> Result<ingot_compiler::model::Model, Failure> {
        self.load_at(Some(batch), 1)
    }

    /// The forward pass of one of `k` micro-batches of the model's batch, named for what the
    /// step trains (`gpt2 in 4 micro-batches`), for a step accumulating `k` of them.
    pub fn load_accumulated(&self, k: usize) -> Result<ingot_compiler::model::Model, Failure> {
        self.load_at(None, k)
    }

    /// `--batch N` beside a named model: the batch to build it at. A batch the model's spec
    /// writes itself (`cnn:batch=64`) must be the same, or both are named; `--batch` beside a
    /// model file is refused (its batch is in its text). `None` without `--batch`, and for
    /// `--onnx`, whose import takes it.
    fn named_batch(&self) -> Result<Option<usize>, Failure> {
        let Some(b) = self.onnx.import.batch else {
            return Ok(None);
        };
        if self.onnx.onnx.is_some() {
            return Ok(None);
        }
        let Some(name) = &self.model else {
            return Err(Failure::new(
                2,
                "--batch applies to a named model (--model NAME) or an ONNX model (--onnx MODEL.onnx): a model file's batch is written in its text",
            ));
        };
        match ingot_models::spec_batch(name)? {
            Some(s) if s as u64 != b => Err(Failure::new(
                2,
                format!("--batch {b} contradicts batch={s} in --model {name}: give the batch once"),
            )),
            _ => Ok(Some(b as usize)),
        }
    }

    fn load_at(
        &self,
        batch: Option<usize>,
        k: usize,
    ) -> Result<ingot_compiler::model::Model, Failure> {
        let given = self.named_batch()?;
        let batch = batch.or(given);
        // With accumulation the forward graph is one micro-batch's: batch / K.
        let batch = match (k > 1, batch) {
            (false, b) => b,
            (true, b) => {
                let Some(name) = &self.model else {
                    return Err(Failure::new(
                        2,
                        "--accumulate needs --model NAME: a model file's batch is written in its text",
                    ));
                };
                let whole = match b {
                    Some(b) => b,
                    None => model_batch(&ingot_models::by_name(name)?).ok_or_else(|| {
                        Failure::new(2, format!("--accumulate: {name} has no batch input x"))
                    })?,
                };
                if whole % k != 0 {
                    return Err(Failure::new(
                        2,
                        format!("--accumulate {k} must divide the batch of {whole}"),
                    ));
                }
                Some(whole / k)
            }
        };
        let mut model = match (batch, &self.model) {
            (None, _) => self.load_model()?,
            // --batch N at the model's own batch: the model as its name builds it.
            (Some(b), Some(name)) if k == 1 && given == Some(b) => {
                let m = ingot_models::by_name(name)?;
                match model_batch(&m) == Some(b) {
                    true => m,
                    false => ingot_models::at_batch(name, b, ingot_compiler::ir::DType::F32)?,
                }
            }
            (Some(b), Some(name)) if k > 1 => {
                let mut m = ingot_models::at_batch(name, b, ingot_compiler::ir::DType::F32)?;
                m.name = format!("{name} in {k} micro-batches");
                m
            }
            (Some(b), Some(name)) => {
                ingot_models::at_batch(name, b, ingot_compiler::ir::DType::F32)?
            }
            // An ONNX model at another batch: imported again with that batch (the file's
            // batch axis must be symbolic; the import says so otherwise).
            (Some(b), None) if self.onnx.onnx.is_some() && k == 1 => {
                let mut at = self.onnx.clone();
                at.import.batch = Some(b as u64);
                at.load()?.expect("--onnx is given")
            }
            (Some(_), None) => {
                return Err(Failure::new(
                    2,
                    "another batch size needs --model NAME or --onnx MODEL.onnx: a model file's batch is written in its text",
                ))
            }
        };
        let settings = ingot_compiler::autodiff::optim::OptimizerSettings {
            kind: self
                .optimizer
                .as_deref()
                .and_then(ingot_compiler::autodiff::optim::OptimizerKind::parse),
            lr: self.lr,
            weight_decay: self.weight_decay,
            betas: self.betas,
            momentum: self.momentum,
            eps: self.eps,
        };
        if !settings.is_empty() {
            model.optimizer = settings
                .apply(model.optimizer)
                .map_err(|e| Failure::new(2, format!("the optimizer of {}: {e}", model.name)))?;
        }
        Ok(model)
    }

    fn load_model(&self) -> Result<ingot_compiler::model::Model, Failure> {
        if let Some(m) = self.onnx.load()? {
            return Ok(m);
        }
        match (&self.model, &self.model_file) {
            (Some(name), _) => Ok(ingot_models::by_name(name)?),
            (None, Some(path)) => {
                let text = read_text(path, MAX_MODEL_FILE_BYTES)?;
                let name = path.display().to_string();
                ingot_compiler::model::Model::from_ir_text(&name, &text).map_err(|e| {
                    Failure::new(
                        1,
                        match e {
                            ingot_compiler::error::IrError::Model { .. } => e.to_string(),
                            e => format!("{name}: {e}"),
                        },
                    )
                })
            }
            (None, None) => Err(Failure::new(
                2,
                "give --model NAME, --model-file PATH or --onnx MODEL.onnx",
            )),
        }
    }
}

/// The longest `--model-file` read (the IR text of gpt2 is well under 1 MiB).
pub const MAX_MODEL_FILE_BYTES: u64 = 64 << 20;

/// The text of the file at `path`, at most `cap` bytes of UTF-8; errors name the file.
pub fn read_text(path: &std::path::Path, cap: u64) -> Result<String, Failure> {
    let bytes = ingot_compiler::files::read_capped(path, cap)
        .map_err(|e| Failure::new(1, format!("{}: cannot read it: {e}", path.display())))?;
    String::from_utf8(bytes).map_err(|e| {
        Failure::new(
            1,
            format!(
                "{}: not UTF-8 text (byte {} is not valid UTF-8)",
                path.display(),
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// Checks, before any work, that each output file given can be written (the directory exists
/// and is writable, the path is not a directory) and that none is the same file as an input or
/// as another output (it would be written over: the data set under `--report`, the model file
/// under `-o`), naming the options and the paths when not.
pub fn check_outputs<'a>(
    outputs: &[(&'a str, Option<&'a std::path::Path>)],
    inputs: &[(&'a str, Option<&'a std::path::Path>)],
) -> Result<(), Failure> {
    let given =
        |list: &[(&'a str, Option<&'a std::path::Path>)]| -> Vec<(&'a str, &'a std::path::Path)> {
            list.iter().filter_map(|&(o, p)| Some((o, p?))).collect()
        };
    let (outputs, inputs) = (given(outputs), given(inputs));
    for (i, &(option, path)) in outputs.iter().enumerate() {
        ingot_compiler::files::check_writable(path).map_err(|e| {
            Failure::new(
                1,
                format!("{option} {}: cannot write there: {e}", path.display()),
            )
        })?;
        let clash = inputs
            .iter()
            .map(|&(o, p)| (o, p, "it would overwrite"))
            .chain(
                outputs[..i]
                    .iter()
                    .map(|&(o, p)| (o, p, "both would write")),
            )
            .find(|&(_, p, _)| ingot_compiler::files::same_file(path, p));
        if let Some((other, p, what)) = clash {
            return Err(Failure::new(
                2,
                format!(
                    "{option} {} is the same file as {other} {}: {what} it; give another path",
                    path.display(),
                    p.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically ([`ingot_compiler::files::write_atomically`]).
pub fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<(), Failure> {
    ingot_compiler::files::write_atomically(path, bytes)
        .map_err(|e| Failure::new(1, format!("{}: cannot write it: {e}", path.display())))
}

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl<E: std::error::Error> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(1, e.to_string())
    }
}

/// Set in the processes of a job other than rank 0 (`--torchrun`): rank 0 prints the run's
/// output (its losses are every rank's mean), the others print only errors.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Silences (or restores) the program's standard output ([`out`]).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}

/// Writes one line of the program's output. A closed pipe (`ingot ... | head`) ends the program
/// quietly with code 0 instead of panicking as `println!` would; other write errors are failures.
pub fn out(text: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    use std::io::Write;
    if QUIET.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let mut stdout = std::io::stdout().lock();
    // Names in the text may hold control characters (terminal escapes): written escaped.
    let text = match text.as_str() {
        Some(s) => printable(s),
        None => std::borrow::Cow::Owned(printable(&text.to_string()).into_owned()),
    };
    match stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(Failure::new(
            1,
            format!("cannot write to standard output: {e}"),
        )),
    }
}

/// Text safe to print to a terminal ([`ingot_compiler::printable::printable`]): every line
/// the program writes, to standard output ([`out`]) or standard error ([`errln!`]), goes
/// through it, so a name holding an escape sequence is printed escaped wherever it was put.
pub use ingot_compiler::printable::printable;

/// `eprintln!` with the line made [`printable`].
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        eprintln!("{}", $crate::printable(&format!($($arg)*)))
    };
}

/// `println!` through [`out`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Runs the program on the process arguments and returns its exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    if let Some(conv) = cli.conv {
        use ingot_runtime::cuda::cudnn::{set_conv_path, ConvSetting};
        set_conv_path(match conv {
            ConvName::Auto => ConvSetting::Auto,
            ConvName::Cudnn => ConvSetting::Cudnn,
            ConvName::Im2col => ConvSetting::Im2col,
        });
    } else if let Err(e) = ingot_runtime::cuda::cudnn::conv_path() {
        // A misspelt INGOT_CONV would otherwise plan NCHW without a word.
        eprintln!("error: {e}");
        return 2;
    }
    let result = match cli.command {
        Command::Plan(a) => plan::run(&a),
        Command::Train(a) => train::run(&a),
        Command::Compile(a) => compile::run(&a),
        Command::Run(a) => run::run(&a),
        Command::Inspect(a) => inspect::run(&a),
        Command::Dsa(a) => dsa::run(&a),
        Command::Data(a) => data::run(&a),
        Command::Onnx(a) => onnx::run(&a),
        Command::Eval(a) => eval::run_eval(&a),
        Command::Predict(a) => eval::run_predict(&a),
        Command::Generate(a) => generate::run(&a),
    };
    match result {
        Ok(()) => 0,
        Err(f) => {
            errln!("ingot: {}", f.message);
            f.code
        }
    }
}
