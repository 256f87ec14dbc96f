//! The `ingot` command line: argument parsing, and one module per subcommand.
//!
//! Exit codes: 0 success; 1 an error (the message names what is wrong); 2 bad arguments;
//! 3 a memory budget the plan exceeds, or a capacity the offset solver cannot meet in time.

mod compile;
mod dsa;
mod inspect;
mod plan;
mod run;
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
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the memory report of a model's training step, before anything runs.
    Plan(plan::PlanArgs),
    /// Train a model for some steps and print the loss of each.
    Train(train::TrainArgs),
    /// Compile a model's training step into a step executable file, planned for one target.
    Compile(compile::CompileArgs),
    /// Train a step executable made by `ingot compile`, as `ingot train` trains a model.
    Run(run::RunArgs),
    /// Print what a step executable holds: its header and its memory report.
    Inspect(inspect::InspectArgs),
    /// Solve an offset-assignment problem (MiniMalloc's CSV format) with Ingot's solver.
    Dsa(dsa::DsaArgs),
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

/// Writes one line of the program's output. A closed pipe (`ingot ... | head`) ends the program
/// quietly with code 0 instead of panicking as `println!` would; other write errors are failures.
pub fn out(text: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(text).and_then(|_| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(Failure::new(
            1,
            format!("cannot write to standard output: {e}"),
        )),
    }
}

/// `println!` through [`out`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::out(format_args!("{}\n", format_args!($($arg)*)))
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
    let result = match cli.command {
        Command::Plan(a) => plan::run(&a),
        Command::Train(a) => train::run(&a),
        Command::Compile(a) => compile::run(&a),
        Command::Run(a) => run::run(&a),
        Command::Inspect(a) => inspect::run(&a),
        Command::Dsa(a) => dsa::run(&a),
    };
    match result {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("ingot: {}", f.message);
            f.code
        }
    }
}
