//! A global allocator that counts every allocation of every thread, for the tests that prove a
//! step (and the loader thread feeding it) allocates nothing: `#[path]`-included by
//! zero_alloc.rs and data_loader.rs, each its own test binary with this as its allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

pub struct Counting;

/// Allocations (and reallocations) since the program started, on any thread.
pub static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Bytes allocated and not yet freed, on any thread.
pub static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// allocator keeps `GlobalAlloc`'s contract exactly as `System` does; what it adds (a count in
// an atomic or a thread-local) never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract (a non-zero size), which
        // is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: as `alloc`: the caller's layout has a non-zero size.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        LIVE_BYTES.fetch_add(new as isize - layout.size() as isize, Ordering::SeqCst);
        // SAFETY: the caller passes a block this allocator (so `System`) gave with `layout`,
        // and a non-zero new size, as `GlobalAlloc::realloc` requires.
        unsafe { System.realloc(p, layout, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: the caller passes a block this allocator (so `System`) gave with `layout`.
        unsafe { System.dealloc(p, layout) }
    }
}

#[global_allocator]
pub static COUNTING: Counting = Counting;
