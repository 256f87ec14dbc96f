//! The counting global allocator of the tests that prove a kernel allocates nothing
//! (`ingot_testkit::counting`), made the allocator of each test binary that `#[path]`-includes
//! this file (fused_alloc.rs, gemm_alloc.rs, fused_compiled.rs).

pub use ingot_testkit::counting::allocations;
use ingot_testkit::counting::Counting;

#[global_allocator]
static COUNTING: Counting = Counting;
