//! `ingot plan`: the memory report of a model's training step, before anything runs.

use crate::failure::Failure;
use ingot_compiler::pipeline;
use ingot_compiler::report::human;

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: crate::model_args::ModelArgs,
    /// Print the versioned JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
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
    pub precision: crate::precision_args::PrecisionArgs,
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
    /// Instead of one plan, find the largest batch whose plan fits --budget: the model is
    /// planned at batch 1, 2, 4, ... until one is over, then bisected. Printed fitted as
    /// --budget fits one step (the loss head in row chunks, matmul and attention outputs
    /// recomputed as the budget demands; no accumulation), with
    /// only the compiler's recomputation of cheap values (the default plan), and without any;
    /// with accumulation, any multiple of the first fits. Needs --model NAME (a model file's
    /// batch is fixed).
    #[arg(long, requires = "budget", conflicts_with_all = ["html", "svg", "eval", "unoptimized"])]
    pub max_batch: bool,
}

/// The plan's total at one batch size.
struct Probe {
    batch: usize,
    total_bytes: usize,
    resident_bytes: usize,
}

/// The largest batch within `budget` (plans are compiled as `opts` says): doubling from the
/// model's smallest batch (1, or 2 for a ResNet whose batch norms need two values,
/// [`ingot_models::min_batch`]), then bisecting between the last that fit and the
/// first over. Returns the largest fitting probe and the smallest one over, or an error naming
/// the smallest batch's total when nothing fits.
fn largest_batch(
    a: &PlanArgs,
    opts: &pipeline::Options,
    budget: usize,
    fitted: bool,
    progress: &dyn Fn(usize),
) -> Result<(Probe, Probe), Failure> {
    let step = a.model.step_options(false);
    let probe = |batch: usize| -> Result<Probe, Failure> {
        progress(batch);
        let model = a.model.load_at_batch(batch)?;
        let failed = |e: &dyn std::fmt::Display| {
            Failure::new(1, format!("{} at batch {batch}: {e}", model.name))
        };
        let c = if fitted {
            // Library calls recomputed as far as it takes (no accumulation).
            use ingot_compiler::fit::{fit, FitError, FitOptions};
            let fo = FitOptions {
                budget,
                recompute: true,
                accumulate: false,
                min_micro_batch: 1,
                // A probe of the largest batch: not with the host's memory.
                offload: false,
            };
            match fit(&model, &step, opts, &fo, None) {
                Ok((_, c, _)) => c,
                Err(FitError::Over { smallest, .. }) => *smallest,
                Err(FitError::Resident { resident, .. }) => {
                    return Ok(Probe {
                        batch,
                        total_bytes: resident,
                        resident_bytes: resident,
                    })
                }
                Err(e) => return Err(failed(&e)),
            }
        } else {
            pipeline::compile_observed_with(&model, &step, opts, &mut |_| {})
                .map_err(|e| failed(&e))?
        };
        Ok(Probe {
            batch,
            total_bytes: c.report.total_bytes,
            resident_bytes: c.report.resident_bytes,
        })
    };
    let least = match &a.model.model {
        Some(name) => ingot_models::min_batch(name)?,
        None => 1,
    };
    let one = probe(least)?;
    if one.total_bytes > budget {
        return Err(Failure::new(
            3,
            format!(
                "no batch fits {} ({budget} bytes): batch {least} alone needs {} ({} bytes), of which {} is resident (parameters, optimizer state, inputs){}",
                human(budget),
                human(one.total_bytes),
                one.total_bytes,
                human(one.resident_bytes),
                if one.resident_bytes > budget {
                    " and is itself over the budget"
                } else {
                    ""
                }
            ),
        ));
    }
    const MOST: usize = 1 << 24;
    let mut lo = one;
    let hi = loop {
        if lo.batch >= MOST {
            return Err(Failure::new(
                1,
                format!("batch {} still fits; stopped looking", lo.batch),
            ));
        }
        let p = probe(lo.batch * 2)?;
        if p.total_bytes > budget {
            break p;
        }
        lo = p;
    };
    let mut hi = hi;
    while hi.batch - lo.batch > 1 {
        let p = probe(lo.batch + (hi.batch - lo.batch) / 2)?;
        if p.total_bytes > budget {
            hi = p;
        } else {
            lo = p;
        }
    }
    Ok((lo, hi))
}

/// `ingot plan --budget SIZE --max-batch`.
fn run_max_batch(a: &PlanArgs, opts: &pipeline::Options, budget: usize) -> Result<(), Failure> {
    use std::io::IsTerminal;
    if a.model.model.is_none() && a.model.onnx.onnx.is_none() {
        return Err(Failure::new(
            2,
            "--max-batch needs --model NAME or --onnx MODEL.onnx (with a symbolic batch axis): a model file's batch is written in its text",
        ));
    }
    if a.model.model.is_some() && a.model.onnx.import.batch.is_some() {
        return Err(Failure::new(
            2,
            "--max-batch searches the batch itself: leave out --batch",
        ));
    }
    if a.model.accumulate.is_some_and(|k| k > 1) {
        return Err(Failure::new(
            2,
            "--max-batch finds the largest batch one step holds; leave out --accumulate (any multiple of that batch fits accumulated)",
        ));
    }
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.enable_steady_tick(std::time::Duration::from_millis(100));
        s
    });
    let mut without = opts.clone();
    if let Some(f) = without.fuse.as_mut() {
        f.remat = false;
    }
    let mut found = Vec::new();
    for (label, o, fitted) in [
        ("fitted (chunks, recompute)", opts, true),
        ("cheap recomputation", opts, false),
        ("without recomputation", &without, false),
    ] {
        let progress = |b: usize| {
            if let Some(s) = &bar {
                s.set_message(format!("planning at batch {b} ({label})"));
            }
        };
        found.push((label, largest_batch(a, o, budget, fitted, &progress)));
    }
    if let Some(s) = bar {
        s.finish_and_clear();
    }
    let mut results = Vec::new();
    for (label, r) in found {
        results.push((label, r?));
    }
    let name = match (&a.model.model, &a.model.onnx.onnx) {
        (Some(name), _) => name.clone(),
        (None, Some(path)) => path.display().to_string(),
        (None, None) => String::new(),
    };
    if a.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|(label, (fit, over))| {
                serde_json::json!({
                    "recompute": match *label {
                        "fitted (chunks, recompute)" => "budget",
                        "cheap recomputation" => "cheap",
                        _ => "none",
                    },
                    "max_batch": fit.batch,
                    "total_bytes": fit.total_bytes,
                    "next_batch": over.batch,
                    "next_total_bytes": over.total_bytes,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "model": name,
            "budget_bytes": budget,
            "max_batch": rows,
        });
        return outln!("{doc}");
    }
    outln!(
        "largest batch of {name} within {} ({budget} bytes):",
        human(budget)
    )?;
    for (label, (fit, over)) in &results {
        outln!(
            "  {label:<26} batch {:>6}: {} ({} bytes); batch {} needs {} ({} bytes)",
            fit.batch,
            human(fit.total_bytes),
            fit.total_bytes,
            over.batch,
            human(over.total_bytes),
            over.total_bytes
        )?;
    }
    if let (Some(_), Some((_, (fit, _)))) = (&a.model.model, results.get(1)) {
        outln!(
            "  train or plan at that batch with: --model {name} --batch {}",
            fit.batch
        )?;
    }
    if let Some((_, (fit, _))) = results.first() {
        outln!(
            "  with accumulation          batch k x {} as k micro-batches of {} (not planned here: the running gradient sums add to the plan above; --budget at that batch gives it)",
            fit.batch,
            fit.batch
        )?;
    }
    Ok(())
}

/// The most bytes `plan --diff` reads of a report: gpt2's `plan --json` is about 130 KB, and
/// the largest plan of a reference model under 1 MB, so this leaves room for models a
/// thousand times larger while `/dev/zero` or a runaway pipe stops with an error.
const MAX_PLAN_JSON_BYTES: u64 = 1 << 30;

/// `ingot plan --diff OLD NEW`.
fn run_diff(files: &[std::path::PathBuf]) -> Result<(), Failure> {
    use ingot_compiler::report::diff;
    let read = |p: &std::path::Path| -> Result<_, Failure> {
        let bytes = ingot_compiler::files::read_capped(p, MAX_PLAN_JSON_BYTES)
            .map_err(|e| Failure::new(2, format!("reading {}: {e}", p.display())))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Failure::new(
                2,
                format!(
                    "reading {}: not UTF-8 text (byte {}): a plan report is `ingot plan --json` output",
                    p.display(),
                    e.utf8_error().valid_up_to()
                ),
            )
        })?;
        diff::read_report(&p.display().to_string(), &text)
            .map_err(|e| Failure::new(2, e.to_string()))
    };
    let [old, new] = files else {
        return Err(Failure::new(2, "--diff takes two files: OLD.json NEW.json"));
    };
    let d = diff::diff(&read(old)?, &read(new)?);
    crate::output::out(format_args!("{d}"))?;
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
    a.model.check_shard_optimizer(a.model.ranks)?;
    let device = match a.device {
        super::train::Device::Cpu => ingot_trainer::session::Device::Cpu,
        super::train::Device::Cuda => ingot_trainer::session::Device::Cuda(Default::default()),
    };
    let mut opts = device.options();
    if a.unoptimized {
        opts = pipeline::Options::unoptimized(opts.plan);
    }
    opts.precision = a.precision.for_device(a.device)?;
    opts.fuse_attention &= !a.no_fuse_attention;
    if let (true, Some(budget)) = (a.max_batch, a.model.budget) {
        return run_max_batch(a, &opts, budget);
    }
    crate::files::check_outputs(
        &[("--html", a.html.as_deref()), ("--svg", a.svg.as_deref())],
        &a.model.input_files(),
    )?;
    let (model, compiled, trace, fitted) = super::stages::load_and_compile(
        &a.model,
        &a.model.step_options(false),
        &opts,
        !a.json,
        true,
    )?;
    if a.timings {
        eprint!(
            "{}",
            crate::output::printable(&super::stages::timings_table(trace, &compiled))
        );
    }
    let report = &compiled.report;
    let eval = match a.eval {
        true => Some(
            ingot_trainer::eval::shared_layout(&model, &compiled, &opts, device.target())
                .map_err(|e| Failure::new(1, e))?,
        ),
        false => None,
    };
    use ingot_compiler::report::picture;
    let pictures = [
        (&a.html, picture::html as fn(&_, &_, &_) -> String),
        (&a.svg, picture::svg),
    ];
    for (path, draw) in pictures {
        if let Some(path) = path {
            crate::files::write_file(
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
        let gathers = ingot_compiler::plan::buckets::gathers(&compiled.graph, &compiled.plan);
        if let (false, Some(o)) = (gathers.is_empty(), doc.as_object_mut()) {
            o.insert(
                "gathers".into(),
                serde_json::to_value(gathers).map_err(|e| Failure::new(1, e.to_string()))?,
            );
        }
        let scatters = ingot_compiler::plan::buckets::scatters(&compiled.graph, &compiled.plan);
        if let (false, Some(o)) = (scatters.is_empty(), doc.as_object_mut()) {
            o.insert(
                "scatters".into(),
                serde_json::to_value(scatters).map_err(|e| Failure::new(1, e.to_string()))?,
            );
        }
        if let (Some(f), Some(o)) = (&fitted, doc.as_object_mut()) {
            o.insert(
                "fitted".into(),
                serde_json::to_value(f).map_err(|e| Failure::new(1, e.to_string()))?,
            );
        }
        if let (Some(l), Some(o)) = (eval, doc.as_object_mut()) {
            o.insert(
                "eval".into(),
                serde_json::to_value(l).map_err(|e| Failure::new(1, e.to_string()))?,
            );
        }
        outln!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| Failure::new(1, e.to_string()))?
        )?;
    } else {
        crate::output::out(format_args!("{}", report.table()))?;
        let buckets = ingot_compiler::plan::buckets::buckets(&compiled.graph, &compiled.plan);
        crate::output::out(format_args!(
            "{}",
            ingot_compiler::plan::buckets::table(&buckets, &compiled.plan)
        ))?;
        let gathers = ingot_compiler::plan::buckets::gathers(&compiled.graph, &compiled.plan);
        crate::output::out(format_args!(
            "{}",
            ingot_compiler::plan::buckets::gather_table(&gathers)
        ))?;
        let scatters = ingot_compiler::plan::buckets::scatters(&compiled.graph, &compiled.plan);
        crate::output::out(format_args!(
            "{}",
            ingot_compiler::plan::buckets::scatter_table(&scatters)
        ))?;
        if let Some(l) = eval {
            outln!("{}", ingot_trainer::eval::layout_line(&l))?;
        }
        if let Some(f) = &fitted {
            outln!("{}", f.line())?;
            let ranks = a.model.step_options(false).ranks;
            if f.offload.is_some() && !super::stages::runs_offload(device.target(), ranks) {
                outln!(
                    "note: a step of {ranks} GPU ranks does not run offload's copies yet: `train` and `compile` refuse this budget (exit 3); on one GPU or with --device cpu they run an offloaded step"
                )?;
            }
        }
        if let Some(r) = &compiled.rewrite {
            outln!(
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
            outln!(
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
            outln!("attention kernel: {line}")?;
        }
        for line in
            ingot_compiler::lower::loss_kernels(&compiled.graph, &compiled.plan, device.target())
        {
            outln!("loss kernel: {line}")?;
        }
    }
    if let Some(budget) = a.model.budget {
        if let Some(l) = eval.filter(|l| l.total_bytes > budget) {
            return Err(Failure::new(
                3,
                format!(
                    "the training and evaluation steps need {} ({} bytes) together, over the budget of {} ({budget} bytes); {}",
                    human(l.total_bytes),
                    l.total_bytes,
                    human(budget),
                    ingot_trainer::eval::layout_line(&l)
                ),
            ));
        }
        if report.total_bytes > budget {
            return Err(Failure::new(3, super::stages::over_budget(report, budget)));
        }
    }
    Ok(())
}
