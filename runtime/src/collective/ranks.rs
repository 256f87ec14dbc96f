//! What every executor of `N` ranks shares (the CPU's `cpu::ranks::CpuRanks`, the GPUs'
//! `cuda::ranks`): `N` steps of a step compiled for `N` ranks, run side by side on `N` threads
//! kept for the run ([`RankThreads`]). What a session sees is one step
//! whose batch is the union of the ranks' shards: a batch written for all ranks together (`N`
//! times one rank's input) is cut into `N` contiguous shards, rank `r` taking the `r`-th; a
//! value of one rank's size (parameters, state, scalars, a fixed batch) goes to every rank.
//! Parameters are the same bits on every rank after each step (every rank applies the same
//! averaged gradients), so they are read from rank 0, which also writes the checkpoints.
//!
//! A step whose optimizer is sharded ([`ingot_compiler::autodiff::shard`]) gives each rank
//! only its rows of some leaves (a copied weight and its moments). The ranks present those
//! leaves whole all the same ([`StepExecutor::leaf_type`]): a whole value written is cut into
//! the ranks' rows ([`rank_part`]), and a read joins every rank's rows in rank order
//! ([`read_whole`]). Initial values, loaded parameters and checkpoints are then the
//! unsharded step's tensors, and a sharded run resumes unsharded, or the other way round.

use crate::error::ExecError;
use crate::executor::StepExecutor;
use crate::tensor::Tensor;
use ingot_compiler::autodiff::shard;
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::{Graph, LeafKind, NodeId, TensorType};
use ingot_compiler::plan::MemoryPlan;

/// The data-parallel ranks an executable was compiled for (1 when it has no collective).
pub fn ranks_of(exe: &Executable) -> usize {
    let g = exe.graph();
    g.ids()
        .find_map(|id| g.node(id).op.collective_ranks())
        .unwrap_or(1)
}

/// What rank `r` of `n` gets of `bytes` written to node `id`: its part ([`rank_part`]) when
/// `bytes` holds `n` ranks' worth of `id` and `id` is an input (a batch for all ranks together)
/// or a leaf each rank holds its rows of (a sharded optimizer's, [`shard::ranks_of`]); all of
/// `bytes` otherwise (parameters, state, scalars, a batch of one rank's size).
pub fn shard<'a>(
    g: &Graph,
    plan: &MemoryPlan,
    id: NodeId,
    bytes: &'a [u8],
    r: usize,
    n: usize,
) -> &'a [u8] {
    let one = plan.location(g, id).bytes;
    if one == 0 || n < 2 || bytes.len() != one * n {
        return bytes;
    }
    // Inputs first: they are written every step, and the test allocates nothing.
    let parted = g.leaves(LeafKind::Input).contains(&id) || shard::ranks_of(g, id) == Some(n);
    match parted {
        true => rank_part(bytes, r, n),
        false => bytes,
    }
}

/// Rank `r`'s part of `whole`, the bytes of `n` ranks' values one after another: the `r`-th of
/// `n` equal contiguous pieces. In row-major order that is rows `r·rows/n .. (r+1)·rows/n` of
/// a tensor, so one cut serves a batch's shards and a sharded weight's rows.
pub fn rank_part(whole: &[u8], r: usize, n: usize) -> &[u8] {
    let one = whole.len() / n.max(1);
    &whole[r * one..(r + 1) * one]
}

/// The whole value of type `whole` whose rows `parts` hold, rank 0's first: the inverse of
/// [`rank_part`]. An error naming both sizes when the parts do not fill `whole` exactly.
pub fn join_rows(parts: &[Tensor], whole: TensorType) -> Result<Tensor, ExecError> {
    let bytes: Vec<u8> = parts.iter().flat_map(|t| t.to_le_bytes()).collect();
    let want = whole.shape.numel() * whole.dtype.size();
    if bytes.len() != want {
        return Err(ExecError::Invalid {
            op: "read_leaf",
            reason: format!(
                "{} ranks hold {} bytes of a {whole} value of {want} bytes",
                parts.len(),
                bytes.len()
            ),
        });
    }
    Tensor::from_le_bytes(whole, &bytes)
}

/// The value of node `id` as the ranks hold it together: every rank's rows joined in rank
/// order for a leaf sharded over them ([`shard::ranks_of`]); rank 0's value otherwise (the
/// same bits on every rank, or an output that is rank 0's own).
pub fn read_whole<E: StepExecutor>(ranks: &[E], id: NodeId) -> Result<Tensor, ExecError> {
    let first = ranks.first().ok_or_else(|| ExecError::Invalid {
        op: "read_leaf",
        reason: "no ranks".into(),
    })?;
    let g = first.graph();
    match shard::ranks_of(g, id) {
        Some(n) if n == ranks.len() => {
            let parts = ranks
                .iter()
                .map(|s| s.read_node(id))
                .collect::<Result<Vec<_>, _>>()?;
            join_rows(&parts, shard::whole_type(g, id))
        }
        _ => first.read_node(id),
    }
}

/// Writes node `id` on every rank: each its shard of a batch written for all ranks together,
/// or all of `bytes` ([`shard()`]).
pub fn write_shards<E: StepExecutor>(
    ranks: &mut [E],
    id: NodeId,
    bytes: &[u8],
) -> Result<(), ExecError> {
    let n = ranks.len();
    let Some(first) = ranks.first() else {
        return Ok(());
    };
    let shards: Vec<&[u8]> = (0..n)
        .map(|r| shard(first.graph(), first.plan(), id, bytes, r, n))
        .collect();
    for (s, b) in ranks.iter_mut().zip(shards) {
        s.write_node_bytes(id, b)?;
    }
    Ok(())
}

/// Runs every rank's evaluation step on its shard of `inputs` (written for all ranks together,
/// [`shard()`] against the evaluation step's plan), one rank after another: an evaluation has no
/// collective, so no rank waits for another.
pub fn eval_shards<E: StepExecutor>(
    ranks: &mut [E],
    inputs: &[(NodeId, &[u8])],
) -> Result<(), ExecError> {
    let n = ranks.len();
    for (r, s) in ranks.iter_mut().enumerate() {
        let mine: Vec<(NodeId, &[u8])> = {
            let eval = s.eval_executable().ok_or_else(|| ExecError::Invalid {
                op: "eval",
                reason: "no evaluation step was loaded with this step".into(),
            })?;
            inputs
                .iter()
                .map(|&(id, b)| (id, shard(eval.graph(), eval.plan(), id, b, r, n)))
                .collect()
        };
        s.eval_with_inputs(&mine)?;
    }
    Ok(())
}

/// One thread per rank, started once and kept for the run: a step runs rank `r` on thread `r`
/// of the pool, and the calling thread waits for all of them. With a thread spawned per rank
/// every step, gpt2's two-GPU step spent 0.42 to 0.50 ms of wall clock beyond its device
/// time; with kept threads, 0.20 to 0.37 ms (2 × H200, docs/benchmarks.md, session 9).
pub struct RankThreads {
    pool: rayon::ThreadPool,
    start: StartLine,
}

/// Where the rank threads meet before each operation, spinning, so that they start it within
/// a few microseconds of each other. A parked thread wakes tens of microseconds after the one
/// woken before it; the ranks of a data-parallel step meet at its collectives, so a rank that
/// started late holds the others there, and the step of the earliest, which is the step's
/// time, lasts that much longer (gpt2 on 2 × H100: 0.04 ms a step, docs/benchmarks.md,
/// session 17). `INGOT_LAUNCH_TOGETHER=0` turns it off.
struct StartLine {
    ranks: usize,
    arrived: std::sync::atomic::AtomicUsize,
    round: std::sync::atomic::AtomicUsize,
    on: bool,
}

impl StartLine {
    fn new(ranks: usize) -> StartLine {
        StartLine {
            ranks,
            arrived: std::sync::atomic::AtomicUsize::new(0),
            round: std::sync::atomic::AtomicUsize::new(0),
            on: std::env::var("INGOT_LAUNCH_TOGETHER").map_or(true, |v| v.trim() != "0"),
        }
    }

    /// Returns once every rank thread has called it this round (every one does: each runs the
    /// same operation, and this is its first statement). The last to arrive opens the next
    /// round only after resetting the count, so no thread of the next round counts early.
    fn cross(&self) {
        use std::sync::atomic::Ordering;
        if !self.on || self.ranks < 2 {
            return;
        }
        let round = self.round.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.ranks {
            self.arrived.store(0, Ordering::Relaxed);
            self.round.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.round.load(Ordering::Acquire) == round {
            spins = spins.saturating_add(1);
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                // A rank thread descheduled for long: give the core away while waiting.
                std::thread::yield_now();
            }
        }
    }
}

impl RankThreads {
    /// `n` threads, named `ingot-rank-{r}`.
    pub fn new(n: usize) -> Result<RankThreads, ExecError> {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .thread_name(|r| format!("ingot-rank-{r}"))
            .build()
            .map(|pool| RankThreads {
                pool,
                start: StartLine::new(n.max(1)),
            })
            .map_err(|e| ExecError::Invalid {
                op: "step",
                reason: format!("could not start the rank threads: {e}"),
            })
    }

    /// Runs `f` on every rank at once, rank `r` on thread `r`: every rank must take part in
    /// each collective, so none may wait for another to finish first. The first error is
    /// returned after all have finished; a rank whose `f` panics gives an error, not a panic.
    pub fn on_every_rank<E: Send>(
        &self,
        ranks: &mut [E],
        f: impl Fn(usize, &mut E) -> Result<(), ExecError> + Sync,
    ) -> Result<(), ExecError> {
        if ranks.len() != self.pool.current_num_threads() {
            return Err(ExecError::Invalid {
                op: "step",
                reason: format!(
                    "{} ranks on {} rank threads",
                    ranks.len(),
                    self.pool.current_num_threads()
                ),
            });
        }
        let cells: Vec<std::sync::Mutex<&mut E>> =
            ranks.iter_mut().map(std::sync::Mutex::new).collect();
        let results = self.pool.broadcast(|ctx| {
            self.start.cross();
            let r = ctx.index();
            let mut rank = cells[r].lock().unwrap_or_else(|p| p.into_inner());
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(r, &mut rank)))
                .unwrap_or_else(|_| Err(panicked()))
        });
        results.into_iter().collect()
    }
}

fn panicked() -> ExecError {
    ExecError::Invalid {
        op: "step",
        reason: "a rank's thread panicked".into(),
    }
}

/// The type of the whole value of leaf `id`, which every rank holds a part of
/// ([`shard::whole_type`]): the executors of several ranks present sharded leaves whole
/// ([`StepExecutor::leaf_type`]). The one place the runtime reads the compiler's sharding
/// rule, so the layer test names one exception.
pub fn whole_type(g: &Graph, id: NodeId) -> TensorType {
    shard::whole_type(g, id)
}

/// A rank thread's result; an error if the thread panicked.
pub fn joined<T>(
    h: std::thread::ScopedJoinHandle<'_, Result<T, ExecError>>,
) -> Result<T, ExecError> {
    h.join().unwrap_or_else(|_| Err(panicked()))
}

/// A one-rank step executor that [`Ranks`] runs `N` of: the CPU's planned step, a GPU's step.
pub trait RankStep: StepExecutor + Send + Sized {
    /// Whether [`Ranks`] has each rank copy its shard of a step's inputs on the rank's own
    /// thread, right before its step (GPUs: each copy is queued on the rank's stream, so the
    /// copies overlap), rather than writing every rank's shard first, one rank after another,
    /// and then stepping them all (the CPU, where a copy is a `memcpy` into the allocation).
    const INPUTS_ON_RANK_THREADS: bool;

    /// Where `ranks` run, in words ("cpu, 2 ranks").
    fn ranks_device(ranks: &[Self]) -> String;
}

/// `N` ranks of one data-parallel step as one step executor (the CPU's
/// `cpu::ranks::CpuRanks`, the GPUs' `cuda::ranks::GpuRanks`): rank `r` is `ranks[r]`, each its
/// own allocation, run on thread `r` of [`RankThreads`]; `X` is what the kind of rank keeps
/// beside them (the GPUs' NCCL information).
pub struct Ranks<E, X = ()> {
    pub(crate) ranks: Vec<E>,
    pub(crate) threads: RankThreads,
    pub(crate) extra: X,
}

impl<E, X> Ranks<E, X> {
    /// The rank steps, rank 0 first.
    pub fn ranks(&self) -> &[E] {
        &self.ranks
    }
}

impl<E: RankStep, X> StepExecutor for Ranks<E, X> {
    fn graph(&self) -> &Graph {
        self.ranks[0].graph()
    }

    fn plan(&self) -> &MemoryPlan {
        self.ranks[0].plan()
    }

    /// Each rank's shard of a batch written for all ranks together, or all of `bytes`
    /// ([`write_shards`]).
    fn write_node_bytes(&mut self, id: NodeId, bytes: &[u8]) -> Result<(), ExecError> {
        write_shards(&mut self.ranks, id, bytes)
    }

    /// A sharded leaf's rows joined from every rank ([`read_whole`]).
    fn read_node(&self, id: NodeId) -> Result<Tensor, ExecError> {
        read_whole(&self.ranks, id)
    }

    /// A sharded leaf's whole type ([`whole_type`]): [`read_whole`] reads it, and a value of it
    /// written is cut into the ranks' rows ([`write_shards`]).
    fn leaf_type(&self, id: NodeId) -> TensorType {
        whole_type(self.graph(), id)
    }

    fn step(&mut self) -> Result<(), ExecError> {
        self.threads.on_every_rank(&mut self.ranks, |_, s| s.step())
    }

    /// Each rank's shard of the inputs, then every rank's step: see
    /// [`RankStep::INPUTS_ON_RANK_THREADS`].
    fn step_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        if !E::INPUTS_ON_RANK_THREADS {
            for &(id, bytes) in inputs {
                self.write_node_bytes(id, bytes)?;
            }
            return self.step();
        }
        let n = self.ranks.len();
        let shards: Vec<Vec<(NodeId, &[u8])>> = (0..n)
            .map(|r| {
                inputs
                    .iter()
                    .map(|&(id, b)| (id, shard(self.graph(), self.plan(), id, b, r, n)))
                    .collect()
            })
            .collect();
        let shards = &shards;
        self.threads
            .on_every_rank(&mut self.ranks, |r, s| s.step_with_inputs(&shards[r]))
    }

    fn eval_executable(&self) -> Option<&Executable> {
        self.ranks[0].eval_executable()
    }

    /// Every rank evaluates its shard of the batch (no collective: the mean of the ranks'
    /// losses is taken where it is read, [`StepExecutor::read_scalar`]), one after another.
    fn eval_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        eval_shards(&mut self.ranks, inputs)
    }

    fn allocated_bytes(&self) -> usize {
        self.ranks[0].allocated_bytes()
    }

    fn device(&self) -> String {
        E::ranks_device(&self.ranks)
    }

    fn threads(&self) -> Option<usize> {
        self.ranks[0].threads()
    }

    /// The slowest rank's device time, where the ranks measure it: the step is done when every
    /// rank is.
    fn last_step_device_seconds(&self) -> Option<f64> {
        self.ranks
            .iter()
            .filter_map(|s| s.last_step_device_seconds())
            .reduce(f64::max)
    }

    /// The value at `at` on every rank: the same on all (a gradient norm, read after the
    /// all-reduce), or each rank's own (its shard's loss), whose mean over the ranks is the
    /// union's (equal shards of a mean loss).
    fn read_scalar(
        &self,
        at: ingot_compiler::plan::Location,
        dtype: ingot_compiler::ir::DType,
    ) -> Result<f64, ExecError> {
        let values = self
            .ranks
            .iter()
            .map(|s| s.read_scalar(at, dtype))
            .collect::<Result<Vec<f64>, _>>()?;
        Ok(crate::collective::launch::mean_of_ranks(&values))
    }

    fn data_ranks(&self) -> usize {
        self.ranks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_compiler::ir::DType;

    #[test]
    fn no_rank_thread_leaves_the_start_line_before_every_one_has_reached_it() {
        // Round after round on one line, each thread counts itself in, crosses, and must then
        // see every thread of its round counted.
        let (ranks, rounds) = (4, 200);
        let mut line = StartLine::new(ranks);
        line.on = true;
        let reached: Vec<std::sync::atomic::AtomicUsize> = (0..rounds)
            .map(|_| std::sync::atomic::AtomicUsize::new(0))
            .collect();
        std::thread::scope(|s| {
            for _ in 0..ranks {
                s.spawn(|| {
                    for r in &reached {
                        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        line.cross();
                        assert_eq!(r.load(std::sync::atomic::Ordering::SeqCst), ranks);
                    }
                });
            }
        });
    }

    #[test]
    fn each_rank_runs_on_its_own_kept_thread_every_step() {
        let threads = RankThreads::new(3).unwrap();
        let mut seen: Vec<Vec<String>> = vec![Vec::new(); 3];
        for _ in 0..4 {
            threads
                .on_every_rank(&mut seen, |r, names| {
                    let name = std::thread::current().name().unwrap_or("").to_string();
                    assert_eq!(name, format!("ingot-rank-{r}"));
                    names.push(name);
                    Ok(())
                })
                .unwrap();
        }
        for (r, names) in seen.iter().enumerate() {
            assert_eq!(names.len(), 4);
            assert!(names.iter().all(|n| *n == format!("ingot-rank-{r}")));
        }
    }

    #[test]
    fn a_failing_or_panicking_rank_is_an_error_after_every_rank_ran() {
        let threads = RankThreads::new(2).unwrap();
        let mut ran = vec![false; 2];
        let e = threads
            .on_every_rank(&mut ran, |r, ran| {
                *ran = true;
                if r == 1 {
                    panic!("rank 1 fails");
                }
                Ok(())
            })
            .unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        assert_eq!(ran, vec![true, true]);
        let mut three = vec![0; 3];
        let e = threads
            .on_every_rank(&mut three, |_, _| Ok(()))
            .unwrap_err();
        assert!(e.to_string().contains("3 ranks on 2 rank threads"), "{e}");
    }

    #[test]
    fn the_ranks_rows_joined_in_rank_order_are_the_whole_value_and_a_short_part_is_an_error() {
        use ingot_compiler::ir::Shape;
        let whole = Tensor::from_f32(
            Shape::new(&[6, 2]),
            (0..12).map(|i| i as f32).collect::<Vec<_>>(),
        );
        let bytes = whole.to_le_bytes();
        let rows = |r: usize| {
            Tensor::from_le_bytes(
                TensorType::new(Shape::new(&[2, 2]), DType::F32),
                rank_part(&bytes, r, 3),
            )
            .unwrap()
        };
        assert_eq!(rows(1).as_f32().unwrap(), [4.0, 5.0, 6.0, 7.0], "rows 2..4");
        let parts = [rows(0), rows(1), rows(2)];
        assert_eq!(join_rows(&parts, whole.ty.clone()).unwrap(), whole);
        let e = join_rows(&parts[..2], whole.ty.clone()).unwrap_err();
        assert!(e.to_string().contains("2 ranks hold 32 bytes"), "{e}");
    }
}
