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

/// A pool of `n` threads, for the unit tests that run a kernel on several thread counts and
/// compare the bits.
#[cfg(test)]
pub(crate) fn pool_of(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .expect("a rayon pool")
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

/// Elements of work below which a kernel stays on the calling thread: waking the pool costs
/// more than it saves.
pub const PARALLEL_ELEMENTS: usize = 1 << 15;

/// Calls `f(b, block)` for every `block`-sized block `b` of `out` (its length a multiple of
/// `block`), spread over the pool's threads in contiguous runs of blocks when there are several
/// threads and `work` elements of work in all reach [`PARALLEL_ELEMENTS`]; otherwise in order
/// on this thread. Each call owns its block, so the result does not depend on the threads.
pub fn for_each_block<T: Send>(
    out: &mut [T],
    block: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if block == 0 {
        return;
    }
    let threads = pool_threads();
    let blocks = out.len() / block;
    if threads > 1 && blocks > 1 && work >= PARALLEL_ELEMENTS {
        use rayon::prelude::*;
        let per = blocks.div_ceil(threads * 4);
        out.par_chunks_mut(per * block)
            .enumerate()
            .for_each(|(t, run)| {
                for (i, b) in run.chunks_mut(block).enumerate() {
                    f(t * per + i, b);
                }
            });
    } else {
        for (b, chunk) in out.chunks_mut(block).enumerate() {
            f(b, chunk);
        }
    }
}
