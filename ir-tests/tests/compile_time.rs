//! Compile time and fusion's scratch grow linearly with depth (issue 53): a model four times as
//! deep plans in at most five times the time and plans at most five times the bytes. Before,
//! a chain of row reductions fused into one kernel whose scratch grew with the square of its
//! depth (2,000 layers of f32[8, 8] planned 252 MiB against 0.5 MiB unfused), and compiling it
//! took quadratic time (the growing kernel lowered again at each merge, every path search
//! walking everything downstream).
//!
//! The tests run one at a time in their own binary (a lock), so that none shares the cores
//! with another while it times; each time is the least of three runs, and is the process's own
//! CPU time where Linux gives it (/proc/self/stat: the offset solver plans large problems on
//! several threads, which a thread's own time would miss), so that other processes on the
//! machine do not move it; elsewhere the wall clock.

use ingot_compiler::models::Model;
use ingot_compiler::pipeline::{self, Options};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Serialises the tests of this binary (each measures the whole process's CPU time).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The CPU time (user and system) this process has run, where the OS tells it: fields 14 and
/// 15 of /proc/self/stat, in clock ticks (100 a second on Linux).
fn process_cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; the fields after it are plain numbers.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    Some(Duration::from_millis((utime + stime) * 10))
}

/// The least of three compile times of the model, and its plan's total bytes.
fn plan_time(m: &Model) -> (Duration, usize) {
    let opts = Options::for_target(ingot_compiler::lower::Target::Cpu);
    let mut best = Duration::MAX;
    let mut total = 0;
    for _ in 0..3 {
        let (cpu, wall) = (process_cpu_time(), Instant::now());
        let c = pipeline::compile(m, &opts).expect("the model compiles");
        let took = match (cpu, process_cpu_time()) {
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
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let chain = |n| {
        let text = ingot_ir_tests::chains::reduce_chain(n, 8, 8);
        Model::from_ir_text("chain", &text).expect("the chain parses")
    };
    let (t1, b1) = plan_time(&chain(150));
    let (t4, b4) = plan_time(&chain(600));
    eprintln!("150 layers: {t1:?}, {b1} bytes; 600 layers: {t4:?}, {b4} bytes");
    // Slack for the timer's 10 ms ticks and the allocator on the shallow one.
    let allowed = t1 * 5 + Duration::from_millis(40);
    assert!(
        t4 <= allowed,
        "150 layers plan in {t1:?}, 600 in {t4:?} (more than five times)"
    );
    assert!(
        b4 <= 5 * b1,
        "150 layers plan {b1} bytes, 600 layers {b4} (more than five times)"
    );
}

/// The narrow GPT the issue names (d_model 64), at `layers` layers.
fn narrow_gpt(layers: usize) -> Model {
    let spec = format!("gpt:vocab=256,d_model=64,layers={layers},heads=4,d_ff=256,seq=64,batch=8");
    ingot_compiler::models::by_name(&spec).expect("the narrow GPT builds")
}

#[test]
fn a_narrow_gpt_four_times_as_deep_plans_in_at_most_five_times_the_time() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (t1, b1) = plan_time(&narrow_gpt(12));
    let (t4, b4) = plan_time(&narrow_gpt(48));
    eprintln!("12 layers: {t1:?}, {b1} bytes; 48 layers: {t4:?}, {b4} bytes");
    let allowed = t1 * 5 + Duration::from_millis(40);
    assert!(
        t4 <= allowed,
        "12 layers plan in {t1:?}, 48 in {t4:?} (more than five times)"
    );
}
