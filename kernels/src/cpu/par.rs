//! Threads for the CPU kernels: a kernel splits its work over the rayon pool it is called in
//! (the CPU executor runs each step inside its own pool, sized by `--threads`), and runs on the
//! calling thread alone outside any pool, so a test or tool calling a kernel directly never
//! wakes rayon's global pool. Every split partitions outputs, never the terms of one sum, so a
//! kernel's bits do not depend on the number of threads.

/// Threads of the rayon pool the caller runs in, or 1 outside any pool.
pub fn pool_threads() -> usize {
    if rayon::current_thread_index().is_some() {
        rayon::current_num_threads()
    } else {
        1
    }
}

/// A shared reference to a closure over raw pointers, handed to the pool's threads for the
/// duration of one blocking parallel loop. The loop's author vouches (in a `SAFETY` comment at
/// the loop) that the calls touch disjoint outputs and read only what no call writes.
pub(crate) struct SendPtr<'a, F>(pub(crate) &'a F);
// SAFETY: a SendPtr is made only around closures whose concurrent calls write disjoint memory
// and read memory no call writes (vouched at each use); sharing it for one blocking parallel
// loop, which returns before the pointers' targets go away, is therefore sound.
unsafe impl<F> Sync for SendPtr<'_, F> {}
// SAFETY: as for Sync.
unsafe impl<F> Send for SendPtr<'_, F> {}
impl<'a, F> SendPtr<'a, F> {
    pub(crate) fn get(&self) -> &'a F {
        self.0
    }
}
