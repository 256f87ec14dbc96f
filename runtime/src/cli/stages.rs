//! Compiling with the pipeline's stages shown: a spinner naming the running stage (on a terminal,
//! never with `--json`), and per-stage wall times for `ingot plan --timings`.

use super::Failure;
use indicatif::ProgressBar;
use ingot_compiler::models::Model;
use ingot_compiler::pipeline::{self, Compiled, Stage};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Loads the model and compiles it. With `spinner`, and when stderr is a terminal, a spinner on
/// stderr names the stage that runs ("tracing", then each [`Stage`]); it is cleared at the end.
/// Returns the compiled step and how long tracing (building the model) took.
pub fn load_and_compile(
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
