//! Compile time and fusion's scratch grow linearly with depth (issue 53): a model four times as
//! deep plans in at most five times the time and plans at most five times the bytes. Before,
//! a chain of row reductions fused into one kernel whose scratch grew with the square of its
//! depth (2,000 layers of f32[8, 8] planned 252 MiB against 0.5 MiB unfused), and compiling it
//! took quadratic time (the growing kernel lowered again at each merge, every path search
//! walking everything downstream).
//!
//! The tests of this binary take turns (a lock), so that no other test shares the cores while
//! one times; each time is the least of three runs, and is the thread's own CPU time where Linux
//! gives it (/proc/thread-self/schedstat), so that other processes on the machine do not move
//! it; elsewhere the wall clock.

use ingot_compiler::models::Model;
use ingot_compiler::pipeline::{self, Options};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The CPU time this thread has run, where the OS tells it.
fn thread_cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// One test times at a time.
static TURN: Mutex<()> = Mutex::new(());

/// The least of three compile times of `m`, and its plan's total bytes. The offset solver
/// runs on this thread alone, so that the thread's CPU time counts all the work.
fn plan_time(m: &Model) -> (Duration, usize) {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut opts = Options::for_target(ingot_compiler::lower::Target::Cpu);
    opts.plan.solver_threads = 1;
    let mut best = Duration::MAX;
    let mut total = 0;
    for _ in 0..3 {
        let (cpu, wall) = (thread_cpu_time(), Instant::now());
        let c = pipeline::compile(m, &opts).expect("the model compiles");
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
    let chain =
        |n| Model::from_ir_text("chain", &ingot_ir_tests::chains::reduce_chain(n, 8, 8)).unwrap();
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

#[test]
fn a_narrow_gpt_four_times_as_deep_plans_in_at_most_five_times_the_time() {
    // Both depths are past the offset solver's large-problem size (4,000 buffers: 50 layers
    // give about 4,200), so both are solved the same way.
    let gpt = |layers| {
        ingot_compiler::models::by_name(&format!(
            "gpt:vocab=256,d_model=64,layers={layers},heads=4,d_ff=256,seq=64,batch=8"
        ))
        .unwrap()
    };
    let (t1, _) = plan_time(&gpt(50));
    let (t4, _) = plan_time(&gpt(200));
    eprintln!("50 layers: {t1:?}; 200 layers: {t4:?}");
    assert!(
        t4 <= t1 * 5,
        "50 layers plan in {t1:?}, 200 in {t4:?} (more than five times)"
    );
}
