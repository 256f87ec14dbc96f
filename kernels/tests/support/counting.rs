//! A global allocator that counts the allocations of the calling thread, for the tests that
//! prove a kernel allocates nothing: `#[path]`-included by fused_alloc.rs and gemm_alloc.rs,
//! each its own test binary with this as its allocator. The counter is thread-local, so the
//! test harness's own threads cannot interfere (the kernels under test spawn none).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the thread-local may be gone while a thread shuts down.
    let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// allocator keeps `GlobalAlloc`'s contract exactly as `System` does; what it adds (a count in
// an atomic or a thread-local) never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count();
        System.realloc(p, layout, new)
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout)
    }
}

#[global_allocator]
pub static COUNTING: Counting = Counting;

/// Heap allocations `f` makes on this thread.
pub fn allocations(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}
