//! The GPU memory contract of a loaded step (DESIGN.md invariants 2 and 3), for the GPU tests
//! (`#[path]`-included by cuda.rs and cuda_bf16.rs): the one allocation is the plan rounded up
//! to the driver's 2 MiB pages, and `steps` steps after the first leave free device memory
//! exactly as it was.

use ingot_trainer::session::Session;

pub fn takes_its_plan_and_allocates_nothing(s: &mut Session, steps: usize) {
    let planned = s.exe().plan().total_bytes;
    let m = s.cuda().expect("a session on the GPU").memory();
    let page = 2 << 20;
    assert_eq!(m.requested, planned.max(1));
    assert!(
        m.allocation >= planned && m.allocation < planned + page,
        "allocation took {} bytes for a plan of {planned}",
        m.allocation
    );
    s.step().unwrap();
    let before = s.cuda().unwrap().free_memory().unwrap();
    for _ in 0..steps {
        s.step().unwrap();
    }
    let after = s.cuda().unwrap().free_memory().unwrap();
    assert_eq!(before, after, "free device memory moved over {steps} steps");
}
