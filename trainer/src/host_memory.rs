//! The host's heap as the process's own allocator sees it: a counting global allocator, so that
//! a CPU run measures its memory as a GPU run does (issue 50). A program makes it its allocator
//! with `#[global_allocator] static A: ingot_trainer::host_memory::Counting = Counting;` (the
//! `ingot` binary does; so do the test binaries that prove a step allocates nothing), and then
//! [`live_bytes`] is the bytes allocated and not yet freed, on every thread. A program with
//! another allocator reads `None`: nothing here guesses.
//!
//! What it counts is Rust's heap: every `Box`, `Vec` and `String` of the process, the step's one
//! allocation among them. Memory taken by C code with its own `malloc` (none on the CPU path)
//! or by the kernel for the process (stacks, the binary's pages) is not in it; that is what
//! separates it from the resident set size, which also moves with the pages the OS chooses to
//! keep, and so could not show "nothing allocated" as a flat line.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};

/// The counting allocator: [`System`]'s, with a count of every allocation and of the live bytes.
pub struct Counting;

/// Allocations (and reallocations) since the program started, on any thread.
pub static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Bytes allocated and not yet freed, on any thread.
pub static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// Set by the first allocation through [`Counting`]: whether it is the program's allocator.
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn allocated(bytes: isize) {
    // Written once: a store on every allocation would bounce the flag's cache line between
    // the threads.
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
    ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
    LIVE_BYTES.fetch_add(bytes, Ordering::SeqCst);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// allocator keeps `GlobalAlloc`'s contract exactly as `System` does; what it adds (counts in
// atomics) never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        allocated(layout.size() as isize);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract (a non-zero size), which
        // is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        allocated(layout.size() as isize);
        // SAFETY: as `alloc`: the caller's layout has a non-zero size.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        allocated(new as isize - layout.size() as isize);
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

/// The process's live heap bytes, where [`Counting`] is its allocator (`None` otherwise).
/// Reading it allocates nothing.
pub fn live_bytes() -> Option<usize> {
    INSTALLED
        .load(Ordering::Relaxed)
        .then(|| LIVE_BYTES.load(Ordering::SeqCst).max(0) as usize)
}

/// Runs `f` and measures the heap bytes it left allocated: `(f's result, bytes)`, the bytes
/// `None` without [`Counting`] as the allocator. Other threads' allocations meanwhile are
/// counted too, so it is for what the calling thread alone does (loading a step).
pub fn held_by<T>(f: impl FnOnce() -> T) -> (T, Option<usize>) {
    let before = live_bytes();
    let out = f();
    let held = live_bytes()
        .zip(before)
        .map(|(after, before)| after.saturating_sub(before));
    (out, held)
}
