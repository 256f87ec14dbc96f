//! `ingot run`: train a step executable made by `ingot compile`, without compiling again.
//!
//! The file is read and checked (docs/executable-format.md: its plan validated against its
//! graph, its program checked against its plan), its program loaded as it is, and the steps run and print exactly as `ingot train` runs and prints them
//! ([`super::train::train`]): the same seeded parameters and synthetic batch for the same
//! `--seed`, so the same losses.

use super::train::{train, Device, StepArgs};
use crate::failure::Failure;
use ingot_compiler::exe::{Executable, Target};
use ingot_trainer::session::{self, Session};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The step executable (made by `ingot compile --model NAME -o FILE`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub run: StepArgs,
}

pub fn run(a: &RunArgs) -> Result<(), Failure> {
    let _held = a
        .run
        .check_outputs(&[("FILE", Some(a.file.as_path()))], true)?;
    let exe = Executable::read(&a.file)?;
    let planned_for = match exe.target() {
        Target::Cpu => Device::Cpu,
        Target::Cuda => Device::Cuda,
    };
    if let Some(p) = a.run.precision.given() {
        if p != exe.precision() {
            return Err(Failure::new(
                1,
                format!(
                    "{}: this executable was compiled in {}, not {p}; the precision is decided when compiling: recompile it with `ingot compile {} --precision {p} -o FILE`",
                    a.file.display(),
                    exe.precision(),
                    model_flag(exe.model())
                ),
            ));
        }
    }
    let device = a.run.session_device(planned_for)?;
    check_target(&a.file, &exe, device)?;
    let mut session = Session::from_executable(exe, a.run.seed, device)?;
    train(&mut session, &a.run, device)
}

/// The executable was planned and lowered for `device`'s target.
fn check_target(file: &Path, exe: &Executable, device: session::Device) -> Result<(), Failure> {
    let target = device.target();
    if target != exe.target() {
        return Err(Failure::new(
            1,
            format!(
                "{}: this executable was planned for {}, not {target}: the two plan different library workspaces (the CPU matmul's packing space, cuBLAS's workspace), so a plan runs only on its own target; recompile it for {target} with `ingot compile {} --device {target} -o FILE`, or run it with --device {}",
                file.display(),
                exe.target(),
                model_flag(exe.model()),
                exe.target()
            ),
        ));
    }
    Ok(())
}

/// The `ingot compile` argument that rebuilds the model named `model`: `--model NAME`, or
/// `--model-file PATH` for a model read from an IR text file (named by its path).
fn model_flag(model: &str) -> String {
    if model.ends_with(".ir") {
        format!("--model-file {model}")
    } else {
        format!("--model {model}")
    }
}
