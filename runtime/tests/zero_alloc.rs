//! Invariant 3: a planned step performs no heap allocation. A counting global allocator watches
//! every allocation this test process makes while steps run.

use indexmap::IndexMap;
use ingot_compiler::autodiff::training_step;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::models;
use ingot_compiler::plan;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::init::{init_leaves, synthetic_batch};
use ingot_runtime::tensor::Tensor;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        System.realloc(p, layout, new)
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations_per_step(spec: &str) -> usize {
    let m = models::by_name(spec).unwrap();
    let step = training_step(&m.graph, &m.optimizer).unwrap();
    let p = plan::plan(&step.graph, &ingot_runtime::cpu::plan_options()).unwrap();
    let mut leaves: IndexMap<String, Tensor> = init_leaves(&step.graph, LeafKind::Parameter, 1);
    leaves.extend(init_leaves(&step.graph, LeafKind::State, 1));
    leaves.extend(synthetic_batch(&step.graph, 1));
    let mut planned = PlannedStep::new(step.graph, p).unwrap();
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
    ] {
        assert_eq!(
            allocations_per_step(spec),
            0,
            "{spec}: a step allocated on the heap"
        );
    }
}
