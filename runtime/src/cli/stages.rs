//! Compiling with the pipeline's stages shown: a spinner naming the running stage (on a terminal,
//! never with `--json`), and per-stage wall times for `ingot plan --timings`.

use super::Failure;
use indicatif::ProgressBar;
use ingot_compiler::models::Model;
use ingot_compiler::pipeline::{self, Compiled, Stage};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// What fitting a step to `--budget` did ([`load_and_compile`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Fitted {
    pub budget_bytes: usize,
    /// The plan's total as the model was asked for.
    pub unfitted_bytes: usize,
    /// Micro-batches accumulated, and the samples in each.
    pub accumulate: usize,
    pub micro_batch: usize,
    /// The fitted plan's total.
    pub total_bytes: usize,
}

impl Fitted {
    /// One line for the report.
    pub fn line(&self) -> String {
        use ingot_compiler::plan::report::human;
        format!(
            "fitted to the budget of {}: {} micro-batches of {} accumulated per step (one update), {} ({} bytes) instead of {} ({} bytes)",
            human(self.budget_bytes),
            self.accumulate,
            self.micro_batch,
            human(self.total_bytes),
            self.total_bytes,
            human(self.unfitted_bytes),
            self.unfitted_bytes
        )
    }
}

/// The message of a plan over `budget`: its total, the budget, and what is live at its peak.
pub fn over_budget(report: &ingot_compiler::plan::report::Report, budget: usize) -> String {
    use ingot_compiler::plan::report::human;
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

/// Loads the model and compiles it ([`compile_as_asked`]), then, with `--budget` and a plan over it, the step fitted to it:
/// a named model (with no `--accumulate` of its own) is compiled again accumulating its batch
/// over 2, 3, 4, ... micro-batches (divisors of the batch, fewest first: each more costs
/// launches and smaller GEMMs) until one fits. Returns what was done, or an error (exit code 3)
/// naming the smallest plan found and what is live at its peak.
pub fn load_and_compile(
    model: &super::ModelArgs,
    step: &ingot_compiler::autodiff::StepOptions,
    opts: &pipeline::Options,
    spinner: bool,
) -> Result<(Model, Compiled, Duration, Option<Fitted>), Failure> {
    let (m, c, t) = compile_as_asked(model, step, opts, spinner)?;
    let Some(budget) = model.budget else {
        return Ok((m, c, t, None));
    };
    if c.report.total_bytes <= budget {
        return Ok((m, c, t, None));
    }
    let cannot = |why: &str, c: &Compiled| {
        Failure::new(
            3,
            format!(
                "{}\n{why}; lower the batch size or sequence length, or raise --budget",
                over_budget(&c.report, budget)
            ),
        )
    };
    let batch = m
        .graph
        .leaf("x")
        .and_then(|x| m.graph.ty(x).shape.dims().first().copied());
    let (Some(_), Some(batch), None) = (&model.model, batch, model.accumulate) else {
        return Err(cannot(
            "it is not fitted by accumulating gradients: that needs --model NAME and no --accumulate of its own",
            &c,
        ));
    };
    let unfitted = c.report.total_bytes;
    let mut best = c;
    for k in (2..=batch).filter(|k| batch % k == 0) {
        let micro = model.load_accumulated(k)?;
        let step_k = ingot_compiler::autodiff::StepOptions {
            accumulate: k,
            ..*step
        };
        let ck = pipeline::compile_observed_with(&micro, &step_k, opts, &mut |_| {})
            .map_err(|e| Failure::new(1, format!("{} accumulated {k} times: {e}", micro.name)))?;
        let total = ck.report.total_bytes;
        if total <= budget {
            let fitted = Fitted {
                budget_bytes: budget,
                unfitted_bytes: unfitted,
                accumulate: k,
                micro_batch: batch / k,
                total_bytes: total,
            };
            return Ok((micro, ck, t, Some(fitted)));
        }
        if total < best.report.total_bytes {
            best = ck;
        }
    }
    Err(cannot(
        &format!(
            "no number of accumulated micro-batches fits either (the plan above is the smallest found, batch {batch} in micro-batches down to 1 sample)"
        ),
        &best,
    ))
}

/// Loads the model and compiles it as asked (no fitting). With `spinner`, and when stderr is a
/// terminal, a spinner on stderr names the stage that runs ("tracing", then each [`Stage`]); it
/// is cleared at the end. Returns the compiled step and how long tracing (building the model)
/// took.
fn compile_as_asked(
    model: &super::ModelArgs,
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
