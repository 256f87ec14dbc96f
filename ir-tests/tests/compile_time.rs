//! Compile time and fusion's scratch grow linearly with depth (issue 53): a model four times as
//! deep plans in at most five times the time and plans at most five times the bytes. Before,
//! a chain of row reductions fused into one kernel whose scratch grew with the square of its
//! depth (2,000 layers of f32[8, 8] planned 252 MiB against 0.5 MiB unfused), and compiling it
//! took quadratic time (the growing kernel lowered again at each merge, every path search
//! walking everything downstream).
//!
//! One test in its own binary, so that no other test of this crate shares the cores while it
//! times; each time is the least of three runs, and is the thread's own CPU time where Linux
//! gives it (/proc/thread-self/schedstat), so that other processes on the machine do not move
//! it; elsewhere the wall clock.

use ingot_compiler::models::Model;
use ingot_compiler::pipeline::{self, Options};
use std::time::{Duration, Instant};

/// The CPU time this thread has run, where the OS tells it.
fn thread_cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// The least of three compile times of the model in `text`, and its plan's total bytes.
fn plan_time(text: &str) -> (Duration, usize) {
    let m = Model::from_ir_text("chain", text).expect("the chain parses");
    let opts = Options::for_target(ingot_compiler::lower::Target::Cpu);
    let mut best = Duration::MAX;
    let mut total = 0;
    for _ in 0..3 {
        let (cpu, wall) = (thread_cpu_time(), Instant::now());
        let c = pipeline::compile(&m, &opts).expect("the chain compiles");
        let took = match (cpu, thread_cpu_time()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => wall.elapsed(),
        };
        best = best.min(took);
        total = c.plan.total_bytes;
    }
    (best, total)
}

#[test]
fn a_reduction_chain_four_times_as_deep_plans_in_at_most_five_times_the_time_and_bytes() {
    let chain = |n| ingot_ir_tests::chains::reduce_chain(n, 8, 8);
    let (t1, b1) = plan_time(&chain(150));
    let (t4, b4) = plan_time(&chain(600));
    eprintln!("150 layers: {t1:?}, {b1} bytes; 600 layers: {t4:?}, {b4} bytes");
    // A few milliseconds of slack for the timer and the allocator on the shallow one.
    let allowed = t1 * 5 + Duration::from_millis(20);
    assert!(
        t4 <= allowed,
        "150 layers plan in {t1:?}, 600 in {t4:?} (more than five times)"
    );
    assert!(
        b4 <= 5 * b1,
        "150 layers plan {b1} bytes, 600 layers {b4} (more than five times)"
    );
}
