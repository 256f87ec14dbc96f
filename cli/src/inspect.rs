//! `ingot inspect`: what a step executable holds, without running it: a header (format
//! version, model, target, device operations, kernels, bytes) and the report table `ingot plan`
//! prints. `--check` also lowers the step again and compares it with the stored program.

use crate::failure::Failure;
use ingot_compiler::exe::{Executable, Layout, VERSION};
use ingot_compiler::lower::Program;
use ingot_compiler::report::{human, Report};
use ingot_kernels::cuda::CudaKernel;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The step executable (made by `ingot compile`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Print one JSON document: the header's fields, the leaves' layouts, the kernels and the
    /// report (the document `ingot plan --json` prints).
    #[arg(long)]
    pub json: bool,
    /// Lower the stored graph and plan again with this ingot and compare with the stored
    /// program (reading the file already validates the plan and checks the program against
    /// it); a difference is an error.
    #[arg(long)]
    pub check: bool,
}

/// A kernel in `--json` output: its name, the size of its source and its launch shape.
#[derive(serde::Serialize)]
struct KernelLine<'a> {
    name: &'a str,
    source_bytes: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
}

/// What the stored program runs each step.
#[derive(serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Operations {
    Cpu { instructions: usize, copies: usize },
    Cuda(ingot_compiler::lower::cuda::OpCounts),
}

/// The `--json` document.
#[derive(serde::Serialize)]
struct Document<'a> {
    file: String,
    format_version: u32,
    file_bytes: u64,
    model: &'a str,
    target: &'a str,
    /// Kernel launches per step.
    launches: usize,
    /// Device operations per step by kind (CUDA), or instructions (CPU).
    operations: Operations,
    kernels: Vec<KernelLine<'a>>,
    kernel_source_bytes: usize,
    planned_bytes: usize,
    layouts: &'a [Layout],
    /// The names of the state leaves whose values the file carries (an imported model's
    /// constants).
    constants: Vec<&'a str>,
    report: &'a Report,
}

pub fn run(a: &InspectArgs) -> Result<(), Failure> {
    let exe = Executable::read(&a.file)?;
    if a.check {
        exe.check_program()
            .map_err(|e| Failure::new(1, format!("{}: {e}", a.file.display())))?;
    }
    let file_bytes = std::fs::metadata(&a.file).map(|m| m.len()).unwrap_or(0);
    let source_bytes = |k: &CudaKernel| k.source.len();
    let (kernels, prelude): (&[CudaKernel], &str) = match exe.program() {
        Program::Cuda(p) => (&p.kernels, &p.prelude),
        Program::Cpu(_) => (&[], ""),
    };
    let operations = match exe.program() {
        Program::Cuda(p) => Operations::Cuda(p.counts()),
        Program::Cpu(p) => Operations::Cpu {
            instructions: p.instrs.len(),
            copies: p.copies.len(),
        },
    };
    let kernel_source_bytes = prelude.len() + kernels.iter().map(source_bytes).sum::<usize>();
    let report = exe.report();
    if a.json {
        let doc = Document {
            file: a.file.display().to_string(),
            format_version: VERSION,
            file_bytes,
            model: exe.model(),
            target: exe.target().name(),
            launches: report.kernels,
            operations,
            kernels: kernels
                .iter()
                .map(|k| KernelLine {
                    name: &k.name,
                    source_bytes: source_bytes(k),
                    grid: k.launch.grid,
                    block: k.launch.block,
                    shared_bytes: k.launch.shared_bytes,
                })
                .collect(),
            kernel_source_bytes,
            planned_bytes: exe.plan().total_bytes,
            layouts: exe.layouts(),
            constants: exe.constants().iter().map(|c| c.name.as_str()).collect(),
            report,
        };
        return outln!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| Failure::new(1, e.to_string()))?
        );
    }
    let count = |kind: &str| exe.layouts().iter().filter(|l| l.kind == kind).count();
    outln!(
        "step executable {}: format version {VERSION}, {file_bytes} bytes",
        a.file.display()
    )?;
    outln!("  model    {}", exe.model())?;
    outln!("  target   {}", exe.target())?;
    outln!(
        "  program  {}",
        match &operations {
            Operations::Cuda(c) => format!(
                "{} kernel launches, {} cuBLAS GEMMs, {} memsets, {} copies{} per step",
                c.launches,
                c.gemms,
                c.memsets,
                c.copies,
                match c.all_reduces {
                    0 => String::new(),
                    n => format!(", {n} NCCL all-reduces"),
                } + &match c.offload_copies {
                    0 => String::new(),
                    n => format!(", {n} offload copies"),
                }
            ),
            Operations::Cpu {
                instructions,
                copies,
            } => format!("{instructions} instructions and {copies} copies per step"),
        }
    )?;
    if let Program::Cuda(p) = exe.program() {
        if p.counts().convs > 0 {
            outln!(
                "  convs    by default (INGOT_CONV unset): {}",
                p.default_routes()
            )?;
        }
    }
    outln!(
        "  kernels  {} launches per step; {}",
        report.kernels,
        if kernels.is_empty() {
            "no kernel sources (the CPU runtime's kernels are built in)".to_string()
        } else {
            format!(
                "{} distinct CUDA C kernels, {} of source with the prelude",
                kernels.len(),
                human(kernel_source_bytes)
            )
        }
    )?;
    outln!(
        "  leaves   {} parameters, {} optimizer state, {} inputs",
        count("parameter"),
        count("state"),
        count("input")
    )?;
    if !exe.constants().is_empty() {
        outln!(
            "  constant {} of the state leaves, their values carried in the file ({})",
            exe.constants().len(),
            human(exe.constants().iter().map(|c| c.bytes.len()).sum::<usize>())
        )?;
    }
    outln!(
        "  bytes    {} planned in one allocation ({})",
        exe.plan().total_bytes,
        human(exe.plan().total_bytes)
    )?;
    if a.check {
        outln!("  check    the stored program is what this ingot lowers")?;
    }
    crate::output::out(format_args!("{}", report.table()))
}
