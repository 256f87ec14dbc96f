//! The CPU executor's threads: one rayon pool per loaded step, sized when it is loaded.
//!
//! Every kernel of a step runs inside the pool (`Pool::install`), and the kernels split their
//! work over the pool they are called in ([`ingot_kernels::cpu::par`]): GEMM tiles, attention
//! problems, and the pieces of fused kernels ([`ingot_kernels::fused::parts`]). Each split
//! partitions outputs, never the terms of a sum, so a step computes the same bits on any number
//! of threads. One thread makes no pool at all: the step runs on the caller's thread exactly as
//! before threads existed.
//!
//! The count comes from [`PlannedStep::with_threads`](super::planned::PlannedStep::with_threads)
//! or, for [`PlannedStep::new`](super::planned::PlannedStep::new), from [`default_threads`]:
//! what the program set with [`set_default_threads`] (the `ingot` command's `--threads`, or the
//! machine's cores), else the `INGOT_THREADS` environment variable, else 1. Libraries and tests
//! therefore run on one thread unless asked, and never oversubscribe a machine that runs many
//! tests at once.

use crate::error::ExecError;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The default set by the program (0: not set).
static DEFAULT: AtomicUsize = AtomicUsize::new(0);

/// The most threads a step may ask for: more is surely a mistake (a typo in `--threads`).
pub const MAX_THREADS: usize = 1024;

/// Each pool thread's stack: room for 128 attention tasks' stack scratch
/// (`kernels::cpu::attention`, 512 KiB each) nested on one thread; a pass makes at most four
/// tasks a thread (64 on 16 threads).
const STACK_BYTES: usize = 64 << 20;

/// Makes `n` the thread count of steps loaded later without an explicit one (0 resets it).
pub fn set_default_threads(n: usize) {
    DEFAULT.store(n, Ordering::Relaxed);
}

/// The thread count of a step loaded without an explicit one (see the [module docs](self)).
pub fn default_threads() -> usize {
    match DEFAULT.load(Ordering::Relaxed) {
        0 => std::env::var("INGOT_THREADS")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|&n| (1..=MAX_THREADS).contains(&n))
            .unwrap_or(1),
        n => n,
    }
}

/// The hardware threads this process may use (1 if the system cannot say).
pub fn machine_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A step's threads: a rayon pool of `threads` workers, or none for one thread.
pub(crate) struct Pool {
    pool: Option<rayon::ThreadPool>,
    threads: usize,
}

impl Pool {
    /// A pool of `threads` threads (1: none); 0 or more than [`MAX_THREADS`] is an error.
    pub(crate) fn new(threads: usize) -> Result<Pool, ExecError> {
        if !(1..=MAX_THREADS).contains(&threads) {
            return Err(ExecError::Invalid {
                op: "threads",
                reason: format!(
                    "{threads} threads asked for; give between 1 and {MAX_THREADS} (--threads)"
                ),
            });
        }
        let pool = if threads == 1 {
            None
        } else {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("ingot-cpu-{i}"))
                // Attention tasks keep 512 KiB of scratch on their stack, and a thread
                // waiting inside one (a GEMM's join) may steal and run another on top of
                // it: up to one frame per task of the pass. Rust's default 2 MiB
                // overflowed with 16 threads (trainer/tests/threads.rs); the stack is
                // reserved, not committed, so a large one costs address space only.
                .stack_size(STACK_BYTES)
                .build()
                .map_err(|e| ExecError::Invalid {
                    op: "threads",
                    reason: format!("cannot start {threads} threads: {e}"),
                })?;
            // Every worker runs one job before the pool is handed out, so that what a thread
            // allocates once when it first looks for work (its entry in the work-stealing
            // queues' memory reclamation, ~2 KiB) is taken while the step loads, not during
            // whichever step that thread first wakes in: on a loaded machine a worker can
            // start late, and the run's heap then grew mid-run (issue 50's flat line).
            pool.broadcast(|_| ());
            Some(pool)
        };
        Ok(Pool { pool, threads })
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` inside the pool (on the calling thread when there is none).
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }
}

/// The slab's base pointer, sent into the pool. The executor's safety argument (in
/// [`super::planned`]) covers every slice made from it, on any thread.
#[derive(Clone, Copy)]
pub(crate) struct Base(pub(crate) *mut u8);
// SAFETY: the pointer is only turned into slices under the planned executor's safety argument,
// which holds whichever thread makes them (the step's caller blocks until the pool is done).
unsafe impl Send for Base {}
// SAFETY: as for Send.
unsafe impl Sync for Base {}

impl Base {
    /// The pointer (a method, so that closures capture the whole `Base`, which is `Send`).
    pub(crate) fn get(self) -> *mut u8 {
        self.0
    }
}
