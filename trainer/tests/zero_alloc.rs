//! Invariant 3: a planned step performs no heap allocation. A counting global allocator watches
//! every allocation this test process makes while steps run.

use indexmap::IndexMap;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::models;
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
    let m = models::by_name(spec).unwrap();
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
}
