//! `ingot dsa`: the offset solver alone, on MiniMalloc's `id,lower,upper,size` CSV format.

use super::Failure;
use indicatif::ProgressBar;
use ingot_compiler::plan::dsa;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

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
    /// Seconds the solver may search.
    #[arg(long, default_value_t = 10.0)]
    pub time_limit: f64,
}

pub fn run(a: &DsaArgs) -> Result<(), Failure> {
    let text = std::fs::read_to_string(&a.input)
        .map_err(|e| Failure::new(1, format!("cannot read {}: {e}", a.input.display())))?;
    let problem =
        dsa::read_csv(&text).map_err(|e| Failure::new(1, format!("{}: {e}", a.input.display())))?;
    if !(a.time_limit.is_finite() && a.time_limit >= 0.0) {
        return Err(Failure::new(
            2,
            format!("--time-limit {} is not a number of seconds", a.time_limit),
        ));
    }
    let opts = dsa::SolveOptions {
        capacity: a.capacity,
        time_limit: Duration::from_secs_f64(a.time_limit),
        ..Default::default()
    };
    // A spinner on stderr while a big problem is solved, only when stderr is a terminal.
    let spinner = (problem.buffers.len() >= SPINNER_BUFFERS && std::io::stderr().is_terminal())
        .then(|| {
            let s = ProgressBar::new_spinner();
            s.set_message(format!(
                "solving {} buffers (at most {:.0} s)",
                problem.buffers.len(),
                a.time_limit
            ));
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
    std::fs::write(&a.output, dsa::write_csv(&problem, &solution))
        .map_err(|e| Failure::new(1, format!("cannot write {}: {e}", a.output.display())))?;
    eprintln!(
        "{} buffers, peak {} bytes, LOAD {} ({:.4}x), {:.3} s",
        problem.buffers.len(),
        solution.peak,
        stats.load,
        solution.peak as f64 / stats.load.max(1) as f64,
        stats.elapsed.as_secs_f64()
    );
    Ok(())
}
