//! `ingot dsa`: the offset solver alone, on MiniMalloc's `id,lower,upper,size` CSV format.

use crate::failure::Failure;
use indicatif::ProgressBar;
use ingot_dsa as dsa;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// The longest problem file read (the largest benchmark, 62,185 buffers, is 1.4 MB).
const MAX_INPUT_BYTES: u64 = 1 << 30;

/// Problems with at least this many buffers get a spinner while solving (on a terminal).
const SPINNER_BUFFERS: usize = 1000;

#[derive(clap::Args, Debug)]
pub struct DsaArgs {
    /// Problem: CSV with header id,lower,upper,size.
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write the solution: the input rows with an offset column.
    #[arg(long)]
    pub output: PathBuf,
    /// Fail (exit 3) unless every buffer fits below this many bytes.
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Seconds the solver may search (`inf`, or more seconds than a Duration holds: no limit).
    #[arg(long, default_value_t = 10.0)]
    pub time_limit: f64,
}

/// The solver's time budget for `--time-limit SECONDS`: NaN and negative numbers are refused
/// (exit 2); a number of seconds too large for a `Duration` (1e300, inf) saturates to no limit.
pub fn time_limit(seconds: f64) -> Result<Duration, Failure> {
    if seconds.is_nan() || seconds < 0.0 {
        return Err(Failure::new(
            2,
            format!("--time-limit {seconds} is not a number of seconds (give one >= 0, or inf)"),
        ));
    }
    Ok(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
}

pub fn run(a: &DsaArgs) -> Result<(), Failure> {
    let time_limit = time_limit(a.time_limit)?;
    crate::files::check_outputs(
        &[("--output", Some(a.output.as_path()))],
        &[("--input", Some(a.input.as_path()))],
    )?;
    let text = crate::files::read_text(&a.input, MAX_INPUT_BYTES)?;
    let problem =
        dsa::read_csv(&text).map_err(|e| Failure::new(1, format!("{}: {e}", a.input.display())))?;
    let opts = dsa::SolveOptions {
        capacity: a.capacity,
        time_limit,
        ..Default::default()
    };
    // A spinner on stderr while a big problem is solved, only when stderr is a terminal.
    let spinner = (problem.buffers.len() >= SPINNER_BUFFERS && std::io::stderr().is_terminal())
        .then(|| {
            let s = ProgressBar::new_spinner();
            s.set_message(if time_limit == Duration::MAX {
                format!("solving {} buffers (no time limit)", problem.buffers.len())
            } else {
                format!(
                    "solving {} buffers (at most {:.0} s)",
                    problem.buffers.len(),
                    time_limit.as_secs_f64()
                )
            });
            s.enable_steady_tick(Duration::from_millis(100));
            s
        });
    let solved = dsa::solve(&problem, &opts);
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let (solution, stats) = match solved {
        Ok(s) => s,
        Err(e) => return Err(Failure::new(3, format!("{}: {e}", a.input.display()))),
    };
    crate::files::write_file(&a.output, dsa::write_csv(&problem, &solution).as_bytes())?;
    errln!(
        "{} buffers, peak {} bytes, LOAD {} ({:.4}x), {:.3} ms",
        problem.buffers.len(),
        solution.peak,
        stats.load,
        solution.peak as f64 / stats.load.max(1) as f64,
        stats.elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
