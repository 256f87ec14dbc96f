//! Compile time and fusion's scratch grow linearly with depth (issue 53): a reduce/broadcast
//! chain four times as deep plans in at most five times the time and the bytes. A narrow GPT's
//! test of the same claim is here too, ignored: it does not pass reliably yet. Before,
//! a chain of row reductions fused into one kernel whose scratch grew with the square of its
//! depth (2,000 layers of f32[8, 8] planned 252 MiB against 0.5 MiB unfused), and compiling it
//! took quadratic time (the growing kernel lowered again at each merge, every path search
//! walking everything downstream).
//!
//! The tests have this binary to themselves, so that no other test of this crate shares the
//! cores while they time, and take turns (a lock) so that neither shares them with the other;
//! each times its two models in turns, five rounds, and the round the machine disturbed least
//! decides. Each time is the thread's own CPU time where Linux gives it
//! (/proc/thread-self/schedstat), elsewhere the wall clock; on a shared virtual machine even
//! CPU time varies by half from run to run, which no single pair of runs can be trusted with.

use ingot_compiler::model::Model;
use ingot_compiler::pipeline::{self, Options};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Held by each test while it times: the tests of this binary run one at a time.
static TIMING: Mutex<()> = Mutex::new(());

/// The CPU time this thread has run, where the OS tells it.
fn thread_cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// One compile of `m` for the CPU: its time and its plan's total bytes.
fn plan_once(m: &Model) -> (Duration, usize) {
    let opts = Options::for_target(ingot_compiler::lower::Target::Cpu);
    let (cpu, wall) = (thread_cpu_time(), Instant::now());
    let c = pipeline::compile(m, &opts).expect("the model compiles");
    let took = match (cpu, thread_cpu_time()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => wall.elapsed(),
    };
    (took, c.plan.total_bytes)
}

/// Compile times of the two models taken in turns over five rounds, and each one's plan
/// bytes. Each round times both models back to back, so that a slow spell of the machine (a
/// neighbour on the host, a throttled core: single runs here vary by half) falls on both.
fn plan_rounds(models: [Model; 2]) -> (Vec<[Duration; 2]>, [usize; 2]) {
    let _turn = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let mut bytes = [0; 2];
    let rounds = (0..5)
        .map(|_| {
            let [(t0, b0), (t1, b1)] = [plan_once(&models[0]), plan_once(&models[1])];
            bytes = [b0, b1];
            [t0, t1]
        })
        .collect();
    (rounds, bytes)
}

#[test]
fn a_reduction_chain_four_times_as_deep_plans_in_at_most_five_times_the_time_and_bytes() {
    let chain = |n| {
        let text = ingot_ir_tests::chains::reduce_chain(n, 8, 8);
        Model::from_ir_text("chain", &text).expect("the chain parses")
    };
    let (rounds, [b1, b4]) = plan_rounds([chain(150), chain(600)]);
    eprintln!("150 and 600 layers, per round: {rounds:?}; {b1} and {b4} bytes");
    // The round whose ratio is least: the one the machine disturbed least. A few
    // milliseconds of slack for the timer and the allocator on the shallow one.
    let within = |[t1, t4]: &[Duration; 2]| t4 <= &(*t1 * 5 + Duration::from_millis(20));
    assert!(
        rounds.iter().any(within),
        "in no round did 600 layers plan within five times 150's time: {rounds:?}"
    );
    assert!(
        b4 <= 5 * b1,
        "150 layers plan {b1} bytes, 600 layers {b4} (more than five times)"
    );
}

/// Not yet a gate (issue 53): at load 12 on the 2-core CI-class machine its best round was
/// 4.77 to 4.95 in four runs of five and 5.24 in the fifth (docs/benchmarks.md, session 37);
/// in session 38 4.27 to 5.43 in eight runs at load 10 to 15, three of them failing (the
/// instructions grow 4x, the time with the misses of a working set that outgrows the cache);
/// in session 42 every run passed but the ratio of each run's fastest rounds was 4.8 to 5.3 at
/// load 1 to 12, before and after the extraction's dense tables: no margin yet;
/// `cargo test --release -p ingot-ir-tests --test compile_time -- --ignored` runs it.
#[test]
#[ignore]
fn a_narrow_gpt_four_times_as_deep_plans_in_at_most_five_times_the_time() {
    let gpt = |layers| {
        let spec =
            format!("gpt:vocab=256,d_model=64,layers={layers},heads=4,d_ff=256,seq=64,batch=8");
        ingot_models::by_name(&spec).expect("the narrow GPT builds")
    };
    let (rounds, _) = plan_rounds([gpt(50), gpt(200)]);
    eprintln!("50 and 200 layers, per round: {rounds:?}");
    let within = |[t1, t4]: &[Duration; 2]| t4 <= &(*t1 * 5 + Duration::from_millis(20));
    assert!(
        rounds.iter().any(within),
        "in no round did 200 layers plan within five times 50's time: {rounds:?}"
    );
}
