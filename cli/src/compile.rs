//! `ingot compile`: compile a model's training step once and write it as a step executable
//! (docs/executable-format.md), to be run later by `ingot run` without compiling again.
//!
//! The file holds the fused step graph, its memory plan for one target, the layout of every
//! leaf, the report, and the program lowered for the target: on `cuda` every device operation
//! with its byte offsets, the dependency graph and the CUDA C of every distinct kernel.
//! Planning, lowering and CUDA C generation need no GPU, so a `cuda` executable can be made on
//! any machine.

use super::train::Device;
use crate::failure::Failure;
use ingot_compiler::exe::Executable;
use ingot_compiler::lower::Program;
use ingot_compiler::report::human;
use ingot_trainer::session;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    #[command(flatten)]
    pub model: crate::model_args::ModelArgs,
    /// The target to plan for: its library workspaces differ (the CPU matmul's packing space,
    /// or cuBLAS's workspace on the GPU), so the executable runs only there. Needs no GPU.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    #[command(flatten)]
    pub precision: crate::precision_args::PrecisionArgs,
    /// Where to write the step executable.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Give the step a learning-rate scale input, so that `ingot run FILE --schedule ...` can
    /// drive a schedule with this one executable, and (AdamW) its step number as an input.
    #[arg(long = "lr-scale-input")]
    pub lr_scale_input: bool,
    /// Keep attention as the plain math it is written in (scores, softmax, ·v) instead of
    /// replacing it by the fused attention op (for comparisons).
    #[arg(long = "no-fuse-attention")]
    pub no_fuse_attention: bool,
}

pub fn run(a: &CompileArgs) -> Result<(), Failure> {
    let device = match a.device {
        Device::Cpu => session::Device::Cpu,
        Device::Cuda => session::Device::Cuda(Default::default()),
    };
    crate::files::check_outputs(
        &[("--output", Some(a.output.as_path()))],
        &a.model.input_files(),
    )?;
    a.model.check_shard_optimizer(a.model.ranks)?;
    // An executable holds no weights, but an ONNX model's constants travel in it. (The one
    // import serves the compile and the constants.)
    a.model.onnx.keep_import();
    let mut opts = device.options();
    opts.precision = a.precision.for_device(a.device)?;
    opts.fuse_attention &= !a.no_fuse_attention;
    let step = a.model.step_options(a.lr_scale_input);
    let (_, compiled, _, fitted) = super::stages::load_and_compile(
        &a.model,
        &step,
        &opts,
        true,
        super::stages::runs_offload(device.target(), step.ranks),
    )?;
    if let Some(f) = &fitted {
        outln!("{}", f.line())?;
    }
    let exe = compiled
        .executable(device.target())
        .map_err(|e| Failure::new(1, format!("lowering for {}: {e}", device.target())))?;
    let exe = a.model.onnx.with_constants(exe)?;
    let bytes = exe.to_bytes()?;
    // What is written must read back as what was compiled: the reader's checks (the plan
    // validated against the graph) pass, and the graph's text form loses nothing.
    let back = Executable::from_bytes(&bytes, &a.output)?;
    if back != exe {
        return Err(Failure::new(
            1,
            format!(
                "{}: the step executable does not read back as the step compiled (a bug in ingot; please report it)",
                a.output.display()
            ),
        ));
    }
    crate::files::write_file(&a.output, &bytes)?;
    let r = exe.report();
    outln!(
        "wrote {} ({} bytes): {} for {} in {}, {} ops, {} kernel launches per step{}, {} planned in one allocation",
        a.output.display(),
        bytes.len(),
        exe.model(),
        exe.target(),
        exe.precision(),
        r.ops,
        r.kernels,
        match exe.program() {
            Program::Cuda(p) => format!(" ({} distinct CUDA C kernels)", p.kernels.len()),
            Program::Cpu(_) => String::new(),
        },
        human(r.total_bytes)
    )
}
