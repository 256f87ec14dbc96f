//! The `ingot` command line: argument parsing, and one module per subcommand.
//!
//! Exit codes: 0 success; 1 an error (the message names what is wrong); 2 bad arguments;
//! 3 a memory budget the plan exceeds, or a capacity the offset solver cannot meet in time.

// First, so that its macros (`outln!`, `errln!`) are in textual scope in every module below.
#[macro_use]
pub mod output;

mod compile;
mod data;
mod device;
mod dsa;
mod eval;
mod failure;
mod files;
mod generate;
mod gpus;
mod inspect;
mod model_args;
pub mod numbers;
pub mod onnx;
mod plan;
mod precision_args;
mod run;
mod stages;
mod train;

pub use failure::Failure;
pub use files::{check_outputs, read_text, write_file, MAX_MODEL_FILE_BYTES};
pub use model_args::ModelArgs;
pub use output::{out, printable, set_quiet};
pub use precision_args::{PrecisionArgs, PrecisionName};

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
    /// are compiled channels-last where cuDNN loads and run through cuDNN (NCHW ones, f32 and
    /// tf32 steps', as im2col + cuBLAS, but for a bf16 stem over few channels given the room
    /// cuDNN's fast algorithm asks, which runs through cuDNN); `im2col` compiles
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
