//! The counting global allocator for the tests that prove a step (and the loader thread feeding
//! it) allocates nothing: `#[path]`-included by zero_alloc.rs, data_loader.rs, generate.rs and
//! flat_host_memory.rs, each its own test binary with the trainer's
//! [`ingot_trainer::host_memory::Counting`] as its allocator (the one the `ingot` program
//! measures its CPU runs with).

#[allow(unused_imports)]
pub use ingot_trainer::host_memory::{ALLOCATIONS, LIVE_BYTES};

#[global_allocator]
pub static COUNTING: ingot_trainer::host_memory::Counting = ingot_trainer::host_memory::Counting;
