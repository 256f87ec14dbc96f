//! `N` CPU ranks as one step executor ([`CpuRanks`]): the rank helpers of
//! [`crate::collective::ranks`] over `N` planned steps, one per rank, each its own allocation
//! and its end of an in-process [`threads`] group. It lives beside [`PlannedStep`] so that the
//! collectives never name the CPU executor: the arrows point from the executors to the
//! collectives, never back.

use super::planned::PlannedStep;
use crate::collective::ranks::{ranks_of, RankStep, RankThreads, Ranks};
use crate::collective::threads;
use crate::error::ExecError;
use ingot_compiler::exe::{Executable, StepPair};

/// `N` CPU ranks of one data-parallel step.
pub type CpuRanks = Ranks<PlannedStep>;

impl RankStep for PlannedStep {
    /// A rank's input copy is a `memcpy` into its allocation: written rank after rank, with
    /// nothing allocated per rank.
    const INPUTS_ON_RANK_THREADS: bool = false;

    fn ranks_device(ranks: &[PlannedStep]) -> String {
        format!("cpu, {} ranks", ranks.len())
    }
}

impl CpuRanks {
    /// Loads `exe` once per rank it was compiled for ([`ranks_of`]), each with its end of one
    /// thread group.
    pub fn new(exe: Executable) -> Result<CpuRanks, ExecError> {
        CpuRanks::group(ranks_of(&exe), || PlannedStep::new(exe.clone()))
    }

    /// As [`CpuRanks::new`], each rank with the pair's evaluation step beside its training
    /// step in one allocation ([`PlannedStep::pair`]): an evaluation runs every rank on its
    /// shard of the batch, and its loss is the mean of theirs.
    pub fn pair(pair: StepPair) -> Result<CpuRanks, ExecError> {
        CpuRanks::group(ranks_of(pair.train()), || PlannedStep::pair(pair.clone()))
    }

    /// `n` ranks, each a step `load` gives with its end of one thread group.
    fn group(
        n: usize,
        load: impl Fn() -> Result<PlannedStep, ExecError>,
    ) -> Result<CpuRanks, ExecError> {
        let mut ranks = Vec::with_capacity(n);
        for c in threads::group(n) {
            let mut s = load()?;
            s.set_collective(Box::new(c))?;
            ranks.push(s);
        }
        let threads = RankThreads::new(ranks.len())?;
        Ok(Ranks {
            ranks,
            threads,
            extra: (),
        })
    }
}
