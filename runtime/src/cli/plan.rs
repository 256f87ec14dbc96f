//! `ingot plan`: the memory report of a model's training step, before anything runs.

use super::Failure;
use ingot_compiler::pipeline;
use ingot_compiler::plan::report::{human, parse_size};

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: super::ModelArgs,
    /// Print the versioned JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Fail with exit code 3 if the plan needs more than this (e.g. 16GiB, 512MiB, 1000000).
    #[arg(long, value_parser = parse_size)]
    pub budget: Option<usize>,
    /// Plan the primitive ops as traced: no egg rewriting, no fusion (for comparison).
    #[arg(long)]
    pub unoptimized: bool,
    /// The target whose plan to show: its library workspaces differ (the CPU matmul's packing
    /// space, or cuBLAS's workspace on the GPU). Planning needs no GPU.
    #[arg(long, value_enum, default_value_t = super::train::Device::Cpu)]
    pub device: super::train::Device,
    /// Also write the plan as a timeline, beside the report table, to this self-contained HTML
    /// page (inline SVG and CSS; nothing is fetched).
    #[arg(long, value_name = "PATH")]
    pub html: Option<std::path::PathBuf>,
    /// Also write the timeline alone, as an SVG file.
    #[arg(long, value_name = "PATH")]
    pub svg: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub precision: super::PrecisionArgs,
    /// Also print how long each compiler stage took, on stderr.
    #[arg(long)]
    pub timings: bool,
    /// Also plan the forward-only evaluation step (`ingot train --val`) into the training
    /// step's allocation and give the total of both and each part (JSON: an "eval" object);
    /// --budget then applies to that total.
    #[arg(long)]
    pub eval: bool,
    /// Keep attention as the plain math it is written in (scores, softmax, ·v) instead of
    /// replacing it by the fused attention op (for comparisons).
    #[arg(long = "no-fuse-attention")]
    pub no_fuse_attention: bool,
    /// Compare two plan reports written by `ingot plan --json` (say, before and after a
    /// change) and print what changed: the totals and the buffers that appeared, disappeared,
    /// grew or shrank, keyed by provenance (layer names), not node ids. Compiles nothing.
    /// Exit code: 0 when the plans agree, 1 when they differ, 2 when a file cannot be read or
    /// is not a plan report of this version.
    #[arg(long, num_args = 2, value_names = ["OLD.json", "NEW.json"], conflicts_with_all = ["model", "model_file", "json", "html", "svg", "budget", "eval"])]
    pub diff: Option<Vec<std::path::PathBuf>>,
}

/// `ingot plan --diff OLD NEW`.
fn run_diff(files: &[std::path::PathBuf]) -> Result<(), Failure> {
    use ingot_compiler::plan::diff;
    let read = |p: &std::path::Path| -> Result<_, Failure> {
        let text = std::fs::read_to_string(p)
            .map_err(|e| Failure::new(2, format!("reading {}: {e}", p.display())))?;
        diff::read_report(&p.display().to_string(), &text)
            .map_err(|e| Failure::new(2, e.to_string()))
    };
    let [old, new] = files else {
        return Err(Failure::new(2, "--diff takes two files: OLD.json NEW.json"));
    };
    let d = diff::diff(&read(old)?, &read(new)?);
    crate::cli::out(format_args!("{d}"))?;
    if d.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            1,
            format!("the plans differ ({} -> {})", old.display(), new.display()),
        ))
    }
}

pub fn run(a: &PlanArgs) -> Result<(), Failure> {
    if let Some(files) = &a.diff {
        return run_diff(files);
    }
    let device = match a.device {
        super::train::Device::Cpu => crate::session::Device::Cpu,
        super::train::Device::Cuda => crate::session::Device::Cuda(Default::default()),
    };
    let mut opts = device.options();
    if a.unoptimized {
        opts = pipeline::Options::unoptimized(opts.plan);
    }
    opts.precision = a.precision.for_device(a.device)?;
    opts.fuse_attention &= !a.no_fuse_attention;
    super::check_outputs([("--html", a.html.as_deref()), ("--svg", a.svg.as_deref())])?;
    let (model, compiled, trace) =
        super::stages::load_and_compile(&a.model, &a.model.step_options(false), &opts, !a.json)?;
    if a.timings {
        eprint!("{}", super::stages::timings_table(trace, &compiled));
    }
    let report = &compiled.report;
    let eval = match a.eval {
        true => Some(
            crate::trainer::eval::shared_layout(&model, &compiled, &opts, device.target())
                .map_err(|e| Failure::new(1, e))?,
        ),
        false => None,
    };
    use ingot_compiler::plan::picture;
    let pictures = [
        (&a.html, picture::html as fn(&_, &_, &_) -> String),
        (&a.svg, picture::svg),
    ];
    for (path, draw) in pictures {
        if let Some(path) = path {
            super::write_file(
                path,
                draw(&compiled.graph, &compiled.plan, report).as_bytes(),
            )?;
        }
    }
    if a.json {
        let mut doc = serde_json::to_value(report).map_err(|e| Failure::new(1, e.to_string()))?;
        let buckets = ingot_compiler::plan::buckets::buckets(&compiled.graph, &compiled.plan);
        if let (false, Some(o)) = (buckets.is_empty(), doc.as_object_mut()) {
            o.insert(
                "buckets".into(),
                serde_json::to_value(buckets).map_err(|e| Failure::new(1, e.to_string()))?,
            );
        }
        if let (Some(l), Some(o)) = (eval, doc.as_object_mut()) {
            o.insert(
                "eval".into(),
                serde_json::to_value(l).map_err(|e| Failure::new(1, e.to_string()))?,
            );
        }
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| Failure::new(1, e.to_string()))?
        )?;
    } else {
        crate::cli::out(format_args!("{}", report.table()))?;
        let buckets = ingot_compiler::plan::buckets::buckets(&compiled.graph, &compiled.plan);
        crate::cli::out(format_args!(
            "{}",
            ingot_compiler::plan::buckets::table(&buckets, &compiled.plan)
        ))?;
        if let Some(l) = eval {
            crate::outln!("{}", crate::trainer::eval::layout_line(&l))?;
        }
        if let Some(r) = &compiled.rewrite {
            crate::outln!(
                "rewrite: {} -> {} ops, e-graph {} nodes in {} classes after {} iterations, stopped: {}",
                r.nodes_before,
                r.nodes_after,
                r.egraph_nodes,
                r.egraph_classes,
                r.iterations,
                r.stop_reason
            )?;
        }
        if let Some(f) = &compiled.fuse {
            crate::outln!(
                "fusion: {} kernels ({} fused, {} with several outputs, {} library calls), {} values recomputed for the backward pass, {} attentions fused",
                f.kernels,
                f.fused_kernels,
                f.multi_output_kernels,
                f.library_calls,
                f.recomputed,
                f.attentions
            )?;
        }
        for line in ingot_compiler::lower::attention_kernels(
            &compiled.graph,
            device.target(),
            compiled.report.precision,
        ) {
            crate::outln!("attention kernel: {line}")?;
        }
    }
    if let Some(budget) = a.budget {
        if let Some(l) = eval.filter(|l| l.total_bytes > budget) {
            return Err(Failure::new(
                3,
                format!(
                    "the training and evaluation steps need {} ({} bytes) together, over the budget of {} ({budget} bytes); {}",
                    human(l.total_bytes),
                    l.total_bytes,
                    human(budget),
                    crate::trainer::eval::layout_line(&l)
                ),
            ));
        }
        if report.total_bytes > budget {
            let mut msg = format!(
                "the plan needs {} ({} bytes), over the budget of {} ({} bytes). At the peak (position {}, {}) live:",
                human(report.total_bytes),
                report.total_bytes,
                human(budget),
                budget,
                report.peak_position,
                report.peak_label()
            );
            msg.push_str(&format!(
                "\n  resident (parameters, optimizer state, inputs): {}",
                human(report.resident_bytes)
            ));
            for b in &report.peak_buffers {
                msg.push_str(&format!(
                    "\n  {} (%{} {}) {} {} {}",
                    b.provenance,
                    b.node,
                    b.op,
                    b.type_label(),
                    human(b.bytes),
                    b.kind
                ));
            }
            msg.push_str("\nlower the batch size or sequence length, or raise --budget");
            return Err(Failure::new(3, msg));
        }
    }
    Ok(())
}
