//! Invariant 3: a planned step performs no heap allocation. A counting global allocator watches
//! every allocation this test process makes while steps run.

use indexmap::IndexMap;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::precision::Precision;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_trainer::init::{init_leaves, synthetic_batch};
use std::sync::atomic::Ordering;

#[path = "support/counting.rs"]
mod counting;
use counting::ALLOCATIONS;

fn allocations_per_step(spec: &str, fused: bool) -> usize {
    allocations_per_step_in(spec, fused, Precision::F32)
}

fn allocations_per_step_in(spec: &str, fused: bool, precision: Precision) -> usize {
    let m = ingot_models::by_name(spec).unwrap();
    let cpu = ingot_compiler::lower::Target::Cpu.plan_options();
    let mut opts = if fused {
        ingot_trainer::session::Session::cpu_options()
    } else {
        ingot_compiler::pipeline::Options::unoptimized(cpu)
    };
    opts.precision = Some(precision);
    let c = ingot_compiler::pipeline::compile(&m, &opts).unwrap();
    let g = c.graph;
    let mut leaves: IndexMap<String, Tensor> = init_leaves(&g, LeafKind::Parameter, 1);
    leaves.extend(init_leaves(&g, LeafKind::State, 1));
    leaves.extend(synthetic_batch(&g, 1));
    let mut planned = PlannedStep::from_plan(g, c.plan).unwrap();
    for (name, value) in &leaves {
        planned.write_leaf(name, value).unwrap();
    }
    planned.step().unwrap();
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..3 {
        planned.step().unwrap();
    }
    (ALLOCATIONS.load(Ordering::SeqCst) - before) / 3
}

#[test]
fn a_planned_training_step_allocates_nothing_on_the_heap() {
    for spec in [
        "mlp",
        "gpt:vocab=128,d_model=32,layers=2,heads=4,d_ff=64,seq=16,batch=2",
        // Convolution (im2col in planned workspace), pooling and momentum SGD.
        "cnn",
    ] {
        for fused in [false, true] {
            assert_eq!(
                allocations_per_step(spec, fused),
                0,
                "{spec} (fused: {fused}): a step allocated on the heap"
            );
        }
    }
    // bf16 (in this same test: the counter sees every thread, so tests must not overlap):
    // bf16 matmuls and reductions widen their operands into planned workspace.
    for spec in [
        "mlp",
        "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2",
    ] {
        for fused in [false, true] {
            assert_eq!(
                allocations_per_step_in(spec, fused, Precision::Bf16),
                0,
                "{spec} (fused: {fused}, bf16): a step allocated on the heap"
            );
        }
    }
    // Several threads (in this same test too): fused kernels cut into pieces with thread
    // scratch in the allocation, GEMM tiles and attention problems over the step's pool.
    // Rayon's queue of jobs sent into a pool from outside is a list of blocks of 63 slots: a
    // new block is allocated (and the old one freed) once every 63 steps; nothing else may.
    let steps = 126;
    let allocations = allocations_in_steps(
        "gpt:vocab=256,d_model=64,layers=1,heads=4,d_ff=256,seq=64,batch=8",
        2,
        steps,
    );
    assert!(
        allocations <= steps / 63 + 1,
        "{allocations} allocations in {steps} steps on 2 threads"
    );
}

/// Allocations in `steps` fused f32 steps of `spec` on `threads` threads, after one.
fn allocations_in_steps(spec: &str, threads: usize, steps: usize) -> usize {
    let m = ingot_models::by_name(spec).unwrap();
    let c = ingot_compiler::pipeline::compile(&m, &ingot_trainer::session::Session::cpu_options())
        .unwrap();
    let g = c.graph;
    let mut leaves: IndexMap<String, Tensor> = init_leaves(&g, LeafKind::Parameter, 1);
    leaves.extend(init_leaves(&g, LeafKind::State, 1));
    leaves.extend(synthetic_batch(&g, 1));
    let exe = ingot_compiler::exe::Executable::from_plan(
        "step",
        g,
        c.plan,
        ingot_compiler::lower::Target::Cpu,
    )
    .unwrap();
    let mut planned = PlannedStep::with_threads(exe, threads).unwrap();
    assert!(
        planned.thread_scratch_bytes() > 0,
        "no fused kernel was cut"
    );
    for (name, value) in &leaves {
        planned.write_leaf(name, value).unwrap();
    }
    planned.step().unwrap();
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..steps {
        planned.step().unwrap();
    }
    ALLOCATIONS.load(Ordering::SeqCst) - before
}
