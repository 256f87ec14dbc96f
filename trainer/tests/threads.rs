//! A CPU step on several threads computes the bits it computes on one: whole training steps of
//! the reference models (fused kernels cut into pieces, GEMM tiles, attention problems and
//! convolutions spread over the step's pool) on 1, 2, 3 and 16 threads, compared leaf by leaf
//! after each step; the one-thread step is the path `planned.rs` checks against the reference
//! interpreter. (That a step on several threads allocates nothing is in zero_alloc.rs: its
//! counter sees every thread, so it must run alone.)

use ingot_compiler::precision::Precision;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_testkit::steps::{cpu_executable, seeded_leaves, step_bytes};
use ingot_trainer::session::Session;

fn compiled(spec: &str, precision: Precision) -> ingot_compiler::pipeline::Compiled {
    let m = ingot_models::by_name(spec).unwrap();
    let mut opts = Session::cpu_options();
    opts.precision = Some(precision);
    ingot_compiler::pipeline::compile(&m, &opts).unwrap()
}

/// Every leaf and the loss after each of `steps` steps on `threads` threads, as bytes.
fn run(spec: &str, precision: Precision, threads: usize, steps: usize) -> Vec<Vec<u8>> {
    let c = compiled(spec, precision);
    let values = seeded_leaves(&c.graph, 5);
    let mut p = PlannedStep::with_threads(cpu_executable(c), threads).unwrap();
    assert_eq!(p.threads(), threads);
    step_bytes(&mut p, &values, steps)
}

const MODELS: [(&str, Precision); 5] = [
    // The README's main job with one layer: every fused kernel of it is large enough to be cut.
    (
        "gpt:vocab=256,d_model=64,layers=1,heads=4,d_ff=256,seq=64,batch=8",
        Precision::F32,
    ),
    (
        "gpt:vocab=256,d_model=64,layers=1,heads=4,d_ff=256,seq=64,batch=8",
        Precision::Bf16,
    ),
    ("mlp", Precision::F32),
    ("mlp", Precision::Bf16),
    ("cnn", Precision::F32),
];

#[test]
fn a_cpu_step_gives_the_same_bits_on_1_2_3_and_16_threads() {
    for (spec, precision) in MODELS {
        let one = run(spec, precision, 1, 2);
        for t in [2, 3, 16] {
            let got = run(spec, precision, t, 2);
            assert!(
                got == one,
                "{spec} ({precision:?}): a step on {t} threads differs from one thread"
            );
        }
    }
}

#[test]
fn a_step_on_several_threads_holds_its_thread_scratch_in_the_one_allocation() {
    let c = compiled(MODELS[0].0, Precision::F32);
    let exe = cpu_executable(c);
    let total = exe.plan().total_bytes;
    let one = PlannedStep::with_threads(exe.clone(), 1).unwrap();
    assert_eq!(one.allocated_bytes(), total);
    assert_eq!(one.thread_scratch_bytes(), 0);
    let four = PlannedStep::with_threads(exe.clone(), 4).unwrap();
    assert!(four.thread_scratch_bytes() > 0, "no fused kernel was cut");
    assert_eq!(
        four.allocated_bytes(),
        total.div_ceil(256) * 256 + four.thread_scratch_bytes()
    );
    let e = PlannedStep::with_threads(exe, 0)
        .err()
        .expect("0 threads is refused");
    assert!(e.to_string().contains("threads"), "{e}");
}
