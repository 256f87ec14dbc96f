//! `ingot inspect`: what a step executable holds, without running it: a header (format
//! version, model, target, kernels, bytes) and the report table `ingot plan` prints.

use super::Failure;
use ingot_compiler::exe::{Executable, Kernel, Layout, VERSION};
use ingot_compiler::plan::report::{human, Report};
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
    kernels: Vec<KernelLine<'a>>,
    kernel_source_bytes: usize,
    planned_bytes: usize,
    layouts: &'a [Layout],
    report: &'a Report,
}

pub fn run(a: &InspectArgs) -> Result<(), Failure> {
    let exe = Executable::read(&a.file)?;
    let file_bytes = std::fs::metadata(&a.file).map(|m| m.len()).unwrap_or(0);
    let source_bytes = |k: &Kernel| k.source.len();
    let kernel_source_bytes =
        exe.kernel_prelude.len() + exe.kernels.iter().map(source_bytes).sum::<usize>();
    if a.json {
        let doc = Document {
            file: a.file.display().to_string(),
            format_version: VERSION,
            file_bytes,
            model: &exe.model,
            target: exe.target.name(),
            launches: exe.report.kernels,
            kernels: exe
                .kernels
                .iter()
                .map(|k| KernelLine {
                    name: &k.name,
                    source_bytes: source_bytes(k),
                    grid: k.grid,
                    block: k.block,
                    shared_bytes: k.shared_bytes,
                })
                .collect(),
            kernel_source_bytes,
            planned_bytes: exe.plan.total_bytes,
            layouts: &exe.layouts,
            report: &exe.report,
        };
        return crate::outln!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| Failure::new(1, e.to_string()))?
        );
    }
    let count = |kind: &str| exe.layouts.iter().filter(|l| l.kind == kind).count();
    crate::outln!(
        "step executable {}: format version {VERSION}, {file_bytes} bytes",
        a.file.display()
    )?;
    crate::outln!("  model    {}", exe.model)?;
    crate::outln!("  target   {}", exe.target)?;
    crate::outln!(
        "  kernels  {} launches per step; {}",
        exe.report.kernels,
        if exe.kernels.is_empty() {
            "no kernel sources (the CPU runtime's kernels are built in)".to_string()
        } else {
            format!(
                "{} distinct CUDA C kernels, {} of source with the prelude",
                exe.kernels.len(),
                human(kernel_source_bytes)
            )
        }
    )?;
    crate::outln!(
        "  leaves   {} parameters, {} optimizer state, {} inputs",
        count("parameter"),
        count("state"),
        count("input")
    )?;
    crate::outln!(
        "  bytes    {} planned in one allocation ({})",
        exe.plan.total_bytes,
        human(exe.plan.total_bytes)
    )?;
    crate::cli::out(format_args!("{}", exe.report.table()))
}
