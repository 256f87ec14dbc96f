//! Compiling with the pipeline's stages shown: a spinner naming the running stage (on a terminal,
//! never with `--json`), and per-stage wall times for `ingot plan --timings`.

use crate::failure::Failure;
use indicatif::ProgressBar;
use ingot_compiler::fit::Fitted;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline::{self, Compiled, Stage};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// The message of a plan over `budget`: its total, the budget, and what is live at its peak.
pub fn over_budget(report: &ingot_compiler::report::Report, budget: usize) -> String {
    use ingot_compiler::report::human;
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
    msg
}

/// Loads the model and compiles it ([`compile_as_asked`]), then, with `--budget` and a plan
/// over it, the step fitted to it by the compiler ([`ingot_compiler::fit::fit`]): library calls
/// recomputed for the backward pass, then gradients accumulated over 2, 3, 4, ... micro-batches
/// (a named model with no `--accumulate` of its own), recomputation accepted where it adds at
/// most a third to the step's FLOPs. With `--accumulate` given, the budget is a gate only.
/// Returns what was done, or an error (exit code 3) naming the smallest plan found and what
/// is live at its peak, or the resident bytes when they alone are over the budget.
///
/// `offload` lets the fitter keep AdamW's moments in host memory as its last resort: where
/// the step's executor runs offload's copies ([`runs_offload`]), and for `plan`, which reports
/// the fit; elsewhere (several CUDA ranks) `train` and `compile` refuse such a budget by exit
/// 3 like any other budget they cannot meet, not at lowering.
pub fn load_and_compile(
    model: &crate::model_args::ModelArgs,
    step: &ingot_compiler::autodiff::StepOptions,
    opts: &pipeline::Options,
    spinner: bool,
    offload: bool,
) -> Result<(Model, Compiled, Duration, Option<Fitted>), Failure> {
    use ingot_compiler::fit::{self, FitError, FitOptions};
    let (m, c, t) = compile_as_asked(model, step, opts, spinner)?;
    let Some(budget) = model.budget else {
        return Ok((m, c, t, None));
    };
    if c.report.total_bytes <= budget {
        return Ok((m, c, t, None));
    }
    let gate = model.accumulate.is_some();
    let fit_opts = FitOptions {
        budget,
        recompute: !gate,
        accumulate: !gate && model.model.is_some(),
        min_micro_batch: match &model.model {
            Some(name) => ingot_models::min_batch(name)?,
            None => 1,
        },
        // Not where the budget is a gate: the step as asked, checked.
        offload: offload && !gate,
    };
    let micro = |k: usize| model.load_accumulated(k).map_err(|f| f.message);
    let builder: Option<&dyn Fn(usize) -> Result<Model, String>> = match model.model {
        Some(_) => Some(&micro),
        None => None,
    };
    match fit::fit(&m, step, opts, &fit_opts, builder) {
        Ok((m, c, fitted)) => Ok((m, c, t, fitted)),
        Err(FitError::Over {
            smallest, tried, ..
        }) => Err(Failure::new(
            3,
            format!(
                "{}\nit does not fit: tried {tried} (the plan above is the smallest found); lower the batch size or sequence length, or raise --budget{}",
                over_budget(&smallest.report, budget),
                if gate { " (or leave out --accumulate to let the compiler fit the step)" } else { "" }
            ),
        )),
        Err(e @ FitError::Resident { .. }) => Err(Failure::new(3, e.to_string())),
        Err(e) => Err(Failure::new(1, format!("{}: {e}", m.name))),
    }
}

/// Whether the executor of a step for `target` over `ranks` data-parallel ranks runs offload's
/// copies: the CPU's always; CUDA's on one GPU (a step of several GPU ranks is refused at
/// lowering, [`ingot_compiler::lower::cuda::Program::check_offload`]).
pub fn runs_offload(target: ingot_compiler::lower::Target, ranks: usize) -> bool {
    target == ingot_compiler::lower::Target::Cpu || ranks <= 1
}

/// Loads the model and compiles it as asked (no fitting). With `spinner`, and when stderr is a
/// terminal, a spinner on stderr names the stage that runs ("tracing", then each [`Stage`]); it
/// is cleared at the end. Returns the compiled step and how long tracing (building the model)
/// took.
fn compile_as_asked(
    model: &crate::model_args::ModelArgs,
    step: &ingot_compiler::autodiff::StepOptions,
    opts: &pipeline::Options,
    spinner: bool,
) -> Result<(Model, Compiled, Duration), Failure> {
    let bar = (spinner && std::io::stderr().is_terminal()).then(|| {
        let s = ProgressBar::new_spinner();
        s.enable_steady_tick(Duration::from_millis(100));
        s.set_message("compiling: trace");
        s
    });
    let start = Instant::now();
    let loaded = model.load();
    let trace = start.elapsed();
    let result = loaded.and_then(|m| {
        let label = m.name.clone();
        let mut observer = |stage: Stage| {
            if let Some(s) = &bar {
                s.set_message(format!("compiling {label}: {}", stage.name()));
            }
        };
        let c = pipeline::compile_observed_with(&m, step, opts, &mut observer)
            .map_err(|e| Failure::new(1, format!("{label}: {e}")))?;
        Ok((m, c, trace))
    });
    if let Some(s) = bar {
        s.finish_and_clear();
    }
    result
}

/// The per-stage table `ingot plan --timings` prints on stderr.
pub fn timings_table(trace: Duration, c: &Compiled) -> String {
    let mut rows = vec![("trace", trace)];
    rows.extend(c.timings.iter().map(|(s, d)| (s.name(), *d)));
    let total: Duration = rows.iter().map(|r| r.1).sum();
    let mut out = String::from("compile time per stage:\n");
    for (name, d) in rows.iter().chain(std::iter::once(&("total", total))) {
        out.push_str(&format!("  {name:<9} {:>10.3} ms\n", d.as_secs_f64() * 1e3));
    }
    out
}
