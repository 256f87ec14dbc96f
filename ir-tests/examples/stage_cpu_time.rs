//! The compile thread's CPU time per pipeline stage for a model at two depths (issue 53), taken
//! in turns over several rounds: where compile time grows faster than the depth.
//!
//! `cargo run --release -p ingot-ir-tests --example stage_cpu_time -- [ROUNDS] [SHALLOW DEEP]`
//! (default five rounds of the narrow GPT,
//! `gpt:vocab=256,d_model=64,layers=L,heads=4,d_ff=256,seq=64,batch=8`, at 50 and 200 layers).
//! Prints each round's stage times and, per stage, the median at each depth and its growth.
//! Times are /proc/thread-self/schedstat's (the thread's own CPU time); the example refuses to
//! run where that file is absent.

use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Options, Stage};
use std::time::Duration;

/// The CPU time this thread has run.
fn thread_cpu_time() -> Result<Duration, String> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat")
        .map_err(|e| format!("no /proc/thread-self/schedstat: {e}"))?;
    let ns = s
        .split_whitespace()
        .next()
        .and_then(|w| w.parse::<u64>().ok())
        .ok_or_else(|| format!("cannot read schedstat {s:?}"))?;
    Ok(Duration::from_nanos(ns))
}

/// One compile of `spec` for the CPU: each stage's CPU time, in pipeline order.
fn stage_times(spec: &str) -> Result<Vec<(Stage, Duration)>, String> {
    let m = ingot_models::by_name(spec).map_err(|e| format!("{spec}: {e}"))?;
    let opts = Options::for_target(Target::Cpu);
    let mut marks: Vec<(Stage, Duration)> = Vec::new();
    let mut err = None;
    let mut observe = |s: Stage| match thread_cpu_time() {
        Ok(t) => marks.push((s, t)),
        Err(e) => err = Some(e),
    };
    pipeline::compile_observed(&m, &opts, &mut observe).map_err(|e| format!("{spec}: {e}"))?;
    let end = thread_cpu_time()?;
    if let Some(e) = err {
        return Err(e);
    }
    let next = marks.iter().skip(1).map(|&(_, t)| t).chain([end]);
    Ok(marks
        .iter()
        .zip(next)
        .map(|(&(s, a), b)| (s, b - a))
        .collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds: usize = match args.first() {
        Some(r) => r
            .parse()
            .map_err(|_| format!("ROUNDS must be a number, not {r:?}"))?,
        None => 5,
    };
    let depths: [usize; 2] = match &args[1.min(args.len())..] {
        [a, b] => [
            a.parse().map_err(|_| format!("bad depth {a:?}"))?,
            b.parse().map_err(|_| format!("bad depth {b:?}"))?,
        ],
        [] => [50, 200],
        _ => return Err("give both depths or neither".into()),
    };
    let spec =
        |l: usize| format!("gpt:vocab=256,d_model=64,layers={l},heads=4,d_ff=256,seq=64,batch=8");
    // Per depth: each stage's times over the rounds, and the rounds' totals (ms).
    let mut all: [Vec<(Stage, Vec<f64>)>; 2] = [Vec::new(), Vec::new()];
    let mut totals: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for r in 0..rounds {
        for (d, &l) in depths.iter().enumerate() {
            let times = stage_times(&spec(l))?;
            let total: f64 = times.iter().map(|&(_, t)| t.as_secs_f64() * 1e3).sum();
            let line: Vec<String> = times
                .iter()
                .map(|(s, t)| format!("{} {:.1}", s.name(), t.as_secs_f64() * 1e3))
                .collect();
            println!(
                "round {r} layers {l}: {} total {total:.1} ms",
                line.join(" ")
            );
            for (s, t) in times {
                let ms = t.as_secs_f64() * 1e3;
                match all[d].iter_mut().find(|(x, _)| *x == s) {
                    Some((_, v)) => v.push(ms),
                    None => all[d].push((s, vec![ms])),
                }
            }
            totals[d].push(total);
        }
    }
    println!("stage      {:>9} {:>9} growth", depths[0], depths[1]);
    for (s, v0) in &all[0] {
        let v1 = all[1].iter().find(|(x, _)| x == s).map(|(_, v)| v.clone());
        let (a, b) = (median(v0.clone()), median(v1.unwrap_or_default()));
        println!("{:<10} {a:>9.1} {b:>9.1} {:.2}", s.name(), b / a);
    }
    let (a, b) = (median(totals[0].clone()), median(totals[1].clone()));
    println!("{:<10} {a:>9.1} {b:>9.1} {:.2}", "total", b / a);
    let best = totals[0]
        .iter()
        .zip(&totals[1])
        .map(|(a, b)| b / a)
        .fold(f64::INFINITY, f64::min);
    println!("best round's total ratio {best:.2}");
    Ok(())
}
