//! `N` CPU ranks as one step executor ([`CpuRanks`]): the rank helpers of
//! [`crate::collective::ranks`] over `N` planned steps, one per rank, each its own allocation
//! and its end of an in-process [`threads`] group. It lives beside [`PlannedStep`] so that the
//! collectives never name the CPU executor: the arrows point from the executors to the
//! collectives, never back.

use super::planned::PlannedStep;
use crate::collective::launch;
use crate::collective::ranks::{
    eval_shards, ranks_of, read_whole, whole_type, write_shards, RankThreads,
};
use crate::collective::threads;
use crate::error::ExecError;
use crate::executor::StepExecutor;
use crate::tensor::Tensor;
use ingot_compiler::exe::{Executable, StepPair};
use ingot_compiler::ir::{DType, Graph, NodeId, TensorType};
use ingot_compiler::plan::check::Location;
use ingot_compiler::plan::MemoryPlan;

/// `N` CPU ranks of one data-parallel step.
pub struct CpuRanks {
    ranks: Vec<PlannedStep>,
    threads: RankThreads,
}

impl CpuRanks {
    /// Loads `exe` once per rank it was compiled for ([`ranks_of`]), each with its end of one
    /// thread group.
    pub fn new(exe: Executable) -> Result<CpuRanks, ExecError> {
        let n = ranks_of(&exe);
        let mut ranks = Vec::with_capacity(n);
        for c in threads::group(n) {
            let mut s = PlannedStep::new(exe.clone())?;
            s.set_collective(Box::new(c))?;
            ranks.push(s);
        }
        let threads = RankThreads::new(ranks.len())?;
        Ok(CpuRanks { ranks, threads })
    }

    /// As [`CpuRanks::new`], each rank with the pair's evaluation step beside its training
    /// step in one allocation ([`PlannedStep::pair`]): an evaluation runs every rank on its
    /// shard of the batch, and its loss is the mean of theirs.
    pub fn pair(pair: StepPair) -> Result<CpuRanks, ExecError> {
        let n = ranks_of(pair.train());
        let mut ranks = Vec::with_capacity(n);
        for c in threads::group(n) {
            let mut s = PlannedStep::pair(pair.clone())?;
            s.set_collective(Box::new(c))?;
            ranks.push(s);
        }
        let threads = RankThreads::new(ranks.len())?;
        Ok(CpuRanks { ranks, threads })
    }

    /// The rank steps, rank 0 first.
    pub fn ranks(&self) -> &[PlannedStep] {
        &self.ranks
    }
}

impl StepExecutor for CpuRanks {
    fn graph(&self) -> &Graph {
        self.ranks[0].graph()
    }

    fn plan(&self) -> &MemoryPlan {
        self.ranks[0].plan()
    }

    fn write_node_bytes(&mut self, id: NodeId, bytes: &[u8]) -> Result<(), ExecError> {
        write_shards(&mut self.ranks, id, bytes)
    }

    /// A sharded leaf's rows joined from every rank ([`read_whole`]).
    fn read_node(&self, id: NodeId) -> Result<Tensor, ExecError> {
        read_whole(&self.ranks, id)
    }

    /// A sharded leaf's whole type ([`whole_type`]): [`read_whole`] reads it, and a
    /// value of it written is cut into the ranks' rows ([`write_shards`]).
    fn leaf_type(&self, id: NodeId) -> TensorType {
        whole_type(self.graph(), id)
    }

    fn step(&mut self) -> Result<(), ExecError> {
        self.threads.on_every_rank(&mut self.ranks, |_, s| s.step())
    }

    fn eval_executable(&self) -> Option<&Executable> {
        self.ranks[0].eval_executable()
    }

    /// Every rank evaluates its shard of the batch (no collective: the mean of the ranks'
    /// losses is taken where it is read, [`StepExecutor::read_scalar`]).
    fn eval_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        eval_shards(&mut self.ranks, inputs)
    }

    fn allocated_bytes(&self) -> usize {
        self.ranks[0].allocated_bytes()
    }

    fn device(&self) -> String {
        format!("cpu, {} ranks", self.ranks.len())
    }

    /// The value at `at` on every rank: the same on all (a gradient norm, read after the
    /// all-reduce), or each rank's own (its shard's loss), whose mean over the ranks is the
    /// union's (equal shards of a mean loss).
    fn read_scalar(&self, at: Location, dtype: DType) -> Result<f64, ExecError> {
        let values = self
            .ranks
            .iter()
            .map(|s| s.read_scalar(at, dtype))
            .collect::<Result<Vec<f64>, _>>()?;
        Ok(launch::mean_of_ranks(&values))
    }

    fn data_ranks(&self) -> usize {
        self.ranks.len()
    }
}
