//! A global allocator that counts the allocations of the calling thread, for the tests that
//! prove a kernel or an executor's node allocates nothing. A test binary makes it its allocator
//! with `#[global_allocator] static A: Counting = Counting;` and measures with [`allocations`].
//! The count is per thread, so the test harness's other threads (tests run in parallel) cannot
//! interfere (the code under test spawns none). The `ingot` binary's own allocator, which
//! counts live bytes over the whole process, is `ingot_trainer::host_memory`'s.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// [`System`]'s allocator, counting each allocation and reallocation of the calling thread.
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
// a thread-local) never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count();
        // SAFETY: the caller passes a block this allocator (so `System`) gave with `layout`,
        // and a non-zero new size, as `GlobalAlloc::realloc` requires.
        unsafe { System.realloc(p, layout, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: the caller passes a block this allocator (so `System`) gave with `layout`.
        unsafe { System.dealloc(p, layout) }
    }
}

/// Heap allocations (and reallocations) `f` makes on this thread, where [`Counting`] is the
/// program's allocator (0 otherwise).
pub fn allocations(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}
