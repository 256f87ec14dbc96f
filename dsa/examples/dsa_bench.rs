//! Solves every `*.csv` offset-assignment problem in a folder and prints a table.
//!
//! ```text
//! cargo run --release -p ingot-dsa --example dsa_bench -- /work/shared/benchmarks/dsa
//!     [--time-limit S]     budget per file (default 10 s)
//!     [--all-greedy]       also run every greedy strategy alone, with its peak and time
//!     [--greedy-only]      only that
//!     [--only TEXT]        with --greedy-only: strategies whose name contains TEXT
//! ```
//!
//! Files named `minimalloc-*` are solved at capacity 1,048,576 (the capacity their benchmark
//! set was made for); every other file is solved without a capacity (minimize the peak within
//! the budget). Times include reading the file. Every solution is checked with the independent
//! validator; the program exits with status 1 if any file fails.

use ingot_dsa::{self as dsa, Greedy, Problem, SolveOptions};
use std::time::{Duration, Instant};

/// Runs greedy `g` alone on `problem` and prints its line: peak, peak over load, seconds.
fn greedy_line(problem: &Problem, g: Greedy) {
    let t = Instant::now();
    let sol = dsa::solve_greedy(problem, g).expect("valid problem");
    println!(
        "    {:<32} {:>14} {:>9.5} {:>8.3}",
        g.to_string(),
        sol.peak,
        sol.peak as f64 / dsa::load(problem) as f64,
        t.elapsed().as_secs_f64()
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut time_limit = Duration::from_secs(10);
    let mut all_greedy = false;
    let mut greedy_only = false;
    let mut only: Option<String> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--time-limit" => {
                let s: f64 = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--time-limit SECONDS");
                time_limit = Duration::from_secs_f64(s);
            }
            "--all-greedy" => all_greedy = true,
            "--only" => only = args.next(),
            "--greedy-only" => {
                all_greedy = true;
                greedy_only = true;
            }
            _ => dir = Some(a),
        }
    }
    let dir = dir.unwrap_or_else(|| "../shared/benchmarks/dsa".to_string());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {dir}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    println!(
        "{:<34} {:>7} {:>14} {:>14} {:>14} {:>9} {:>9} {:>8} {:>8} {:>10}  notes",
        "file",
        "buffers",
        "LOAD",
        "greedy peak",
        "final peak",
        "greedy/L",
        "peak/L",
        "greedy s",
        "total s",
        "nodes"
    );
    let mut failures = 0;
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let t0 = Instant::now();
        let text = std::fs::read_to_string(&path).expect("readable file");
        let problem: Problem = match dsa::read_csv(&text) {
            Ok(p) => p,
            Err(e) => {
                println!("{name}: {e}");
                failures += 1;
                continue;
            }
        };
        if greedy_only {
            println!("{name}");
            for g in Greedy::ALL {
                if only
                    .as_ref()
                    .is_some_and(|o| !g.to_string().contains(o.as_str()))
                {
                    continue;
                }
                greedy_line(&problem, g);
            }
            continue;
        }
        let capacity = name.starts_with("minimalloc-").then_some(1_048_576);
        let opts = SolveOptions {
            capacity,
            time_limit,
            ..SolveOptions::default()
        };
        let result = dsa::solve(&problem, &opts);
        let secs = t0.elapsed().as_secs_f64();
        match result {
            Ok((sol, st)) => {
                let valid = dsa::validate(&problem, &sol);
                if valid.is_err() {
                    failures += 1;
                }
                let mut notes = format!("greedy: {}", st.greedy);
                if st.optimal {
                    notes.push_str(", optimal");
                }
                if st.budget_exhausted {
                    notes.push_str(", budget spent");
                }
                if let Err(e) = valid {
                    notes.push_str(&format!(", INVALID: {e}"));
                }
                println!(
                    "{:<34} {:>7} {:>14} {:>14} {:>14} {:>9.5} {:>9.5} {:>8.3} {:>8.3} {:>10}  {}",
                    name,
                    problem.buffers.len(),
                    st.load,
                    st.greedy_peak,
                    sol.peak,
                    st.greedy_peak as f64 / st.load as f64,
                    sol.peak as f64 / st.load as f64,
                    st.greedy_elapsed.as_secs_f64(),
                    secs,
                    st.nodes_explored,
                    notes
                );
            }
            Err(e) => {
                failures += 1;
                println!("{name}: {e} ({secs:.3} s)");
            }
        }
        if all_greedy {
            for g in Greedy::ALL {
                greedy_line(&problem, g);
            }
        }
    }
    if failures > 0 {
        eprintln!("{failures} file(s) failed");
        std::process::exit(1);
    }
}
