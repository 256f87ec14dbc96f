//! Solves one `id,lower,upper,size` problem the way Ingot's memory planner does (no capacity,
//! a node budget, a 10 s safety net) and prints the solver's statistics and the CPU time:
//!
//! ```text
//! cargo run --release -p ingot-dsa --example solve_csv -- problem.csv [--nodes N] [--repeat R] [--out solution.csv]
//! ```
//!
//! The planner's problems can be written with `ingot dsa`'s CSV format; the printed peak is
//! what the plan's slab would be.

use ingot_dsa::{self as dsa, SolveOptions};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let file = args.first().expect("a CSV file");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse::<u64>().expect("a number"))
    };
    let nodes = flag("--nodes").unwrap_or(100_000);
    let repeat = flag("--repeat").unwrap_or(1);
    let text = std::fs::read_to_string(file).expect("a readable file");
    let mut problem = dsa::read_csv(&text).expect("a valid problem");
    problem.alignment = 256;
    for _ in 0..repeat {
        let t = Instant::now();
        let (sol, stats) = dsa::solve(
            &problem,
            &SolveOptions {
                time_limit: Duration::from_secs(10),
                node_limit: nodes,
                ..Default::default()
            },
        )
        .expect("solvable");
        if let Some(i) = args.iter().position(|a| a == "--out") {
            let out = args.get(i + 1).expect("--out FILE");
            std::fs::write(out, dsa::write_csv(&problem, &sol)).expect("a writable file");
        }
        println!(
            "{file}: n {} load {} greedy {} ({}) peak {} lower bound {} nodes {} improved {} in {:.3} s (greedy {:.3} s)",
            problem.buffers.len(),
            stats.load,
            stats.greedy_peak,
            stats.greedy,
            sol.peak,
            stats.lower_bound,
            stats.nodes_explored,
            stats.improved_by_search,
            t.elapsed().as_secs_f64(),
            stats.greedy_elapsed.as_secs_f64(),
        );
    }
}
