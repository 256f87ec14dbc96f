//! `N` GPUs of this machine as one step executor: the ranks of a step compiled for `N`
//! data-parallel ranks, rank `r` on GPU `r`, each with its own allocation, stream and end of one
//! NCCL group, each driven by a thread of its own kept for the run (one process, one thread per GPU).
//!
//! What a session sees is what [`crate::cpu::ranks::CpuRanks`] shows it: one step whose
//! batch is the union of the ranks' shards (an input written for all ranks together is cut into
//! `N` contiguous shards, rank `r` taking the `r`-th; anything of one rank's size goes to
//! every rank), parameters read from rank 0 (every rank applies the same averaged gradients),
//! each step's loss the mean of the ranks' losses, and the leaves of a sharded optimizer
//! whole (written cut into the ranks' rows, read joined from them: the CPU ranks' helpers).

use super::device::{CudaOptions, CudaStep, RankGate};
use super::nccl;
use crate::collective::ranks::{joined, ranks_of, RankStep, RankThreads, Ranks};
use crate::error::ExecError;
use crate::executor::StepExecutor;
use cudarc::driver::{result, CudaContext};
use ingot_compiler::exe::{Executable, StepPair};

/// NCCL as the group found it, and the device memory its communicators took.
#[derive(Clone, Debug)]
pub struct NcclInfo {
    pub version: String,
    pub path: std::path::PathBuf,
    /// Per rank: the drop in free memory making the communicators caused, plus the drop its
    /// first all-reduces (NCCL's connections) caused while loading.
    pub bytes: Vec<usize>,
    /// Whether every rank's step memory is an NCCL symmetric window
    /// ([`CudaStep::symmetric`]).
    pub symmetric: bool,
}

/// The ranks of one data-parallel step, one per GPU, and NCCL's information.
pub type GpuRanks = Ranks<CudaStep, NcclInfo>;

impl RankStep for CudaStep {
    /// Each rank queues its shard's copies on its own stream, from its own thread.
    const INPUTS_ON_RANK_THREADS: bool = true;

    fn ranks_device(ranks: &[CudaStep]) -> String {
        format!(
            "{} ... cuda:{}, {} ranks",
            ranks[0].device(),
            ranks.len() - 1,
            ranks.len()
        )
    }
}

fn device_error(what: &str) -> impl FnOnce(String) -> ExecError + '_ {
    move |reason| ExecError::Device {
        what: what.into(),
        reason,
    }
}

impl GpuRanks {
    /// Loads `exe` (lowered for CUDA) once per rank it was compiled for ([`ranks_of`]), rank
    /// `r` on GPU `r`: NCCL is loaded (an error naming where it looked when it is absent), one
    /// communicator per GPU made (`ncclCommInitAll`), and the ranks loaded side by side, each
    /// on its own thread. `serial` is [`CudaOptions::serial`] for every rank.
    pub fn new(exe: Executable, serial: bool) -> Result<GpuRanks, ExecError> {
        let bytes = exe.plan().total_bytes;
        GpuRanks::load(exe, None, bytes, serial)
    }

    /// As [`GpuRanks::new`], each rank with the pair's evaluation step beside its training step
    /// in one allocation (`CudaStep::rank_with`): an evaluation runs every rank on its shard
    /// of the batch, and its loss is the mean of theirs.
    pub fn pair(pair: StepPair, serial: bool) -> Result<GpuRanks, ExecError> {
        let bytes = pair.allocation_bytes();
        let (train, eval, _) = pair.into_parts();
        GpuRanks::load(train, Some(eval), bytes, serial)
    }

    /// Loads `exe` (with `eval` beside it, in one allocation of `bytes`) on every rank.
    fn load(
        exe: Executable,
        eval: Option<Executable>,
        bytes: usize,
        serial: bool,
    ) -> Result<GpuRanks, ExecError> {
        let n = ranks_of(&exe);
        if super::device::skip_all_reduces() {
            eprintln!(
                "warning: INGOT_SKIP_ALL_REDUCES=1: the ranks skip their gradient all-reduces \
                 and train apart; their losses and parameters are wrong (a timing diagnostic)"
            );
        }
        let present = super::available()?;
        if n > present {
            return Err(ExecError::Device {
                what: "loading the ranks".into(),
                reason: format!(
                    "the step is compiled for {n} data-parallel ranks, one per GPU, but this \
                     machine has {present} GPU(s)"
                ),
            });
        }
        let lib = nccl::load().map_err(device_error("loading NCCL"))?;
        let version = lib.version().map_err(device_error("loading NCCL"))?;
        let contexts = (0..n)
            .map(|i| {
                CudaContext::new(i).map_err(|e| device_error("creating a context")(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let free = |ctxs: &[std::sync::Arc<CudaContext>]| -> Result<Vec<usize>, ExecError> {
            ctxs.iter()
                .map(|c| {
                    c.bind_to_thread()
                        .map_err(|e| device_error("binding")(e.to_string()))?;
                    result::mem_get_info()
                        .map(|(f, _)| f)
                        .map_err(|e| device_error("reading free memory")(e.to_string()))
                })
                .collect()
        };
        let before = free(&contexts)?;
        let devices: Vec<i32> = (0..n as i32).collect();
        let comms = lib
            .init_all(&devices)
            .map_err(device_error("making the NCCL communicators"))?;
        let after = free(&contexts)?;
        let gate = RankGate::new(n);
        let loaded: Vec<Result<CudaStep, ExecError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = comms
                .into_iter()
                .enumerate()
                .map(|(r, comm)| {
                    let (exe, eval, gate) = (exe.clone(), eval.clone(), &gate);
                    scope.spawn(move || {
                        let opts = CudaOptions { ordinal: r, serial };
                        CudaStep::rank_with(exe, eval, bytes, opts, comm, &|ok| gate.pass(ok))
                    })
                })
                .collect();
            handles.into_iter().map(joined).collect()
        });
        let ranks = loaded.into_iter().collect::<Result<Vec<_>, _>>()?;
        let bytes = ranks
            .iter()
            .enumerate()
            .map(|(r, s)| before[r].saturating_sub(after[r]) + s.memory().collectives)
            .collect();
        drop(contexts);
        let symmetric = ranks.iter().all(CudaStep::symmetric);
        Ok(Ranks {
            threads: RankThreads::new(ranks.len())?,
            ranks,
            extra: NcclInfo {
                version,
                path: lib.path.clone(),
                bytes,
                symmetric,
            },
        })
    }

    /// NCCL's version, path and memory per rank.
    pub fn nccl(&self) -> &NcclInfo {
        &self.extra
    }

    /// Every rank runs its step's operations one at a time with an event after each
    /// ([`CudaStep::profile`]), all ranks at once, so that their collectives meet; returns rank
    /// 0's device time per operation, in milliseconds, in program order.
    pub fn profile(&mut self) -> Result<Vec<f32>, ExecError> {
        let rank0: std::sync::Mutex<Option<Vec<f32>>> = std::sync::Mutex::new(None);
        self.threads.on_every_rank(&mut self.ranks, |r, s| {
            let t = s.profile()?;
            if r == 0 {
                *rank0.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
            }
            Ok(())
        })?;
        let rank0 = rank0.into_inner().unwrap_or_else(|p| p.into_inner());
        rank0.ok_or_else(|| ExecError::Invalid {
            op: "profile",
            reason: "rank 0 returned no times".into(),
        })
    }
}

impl GpuRanks {
    /// Every rank replays its step as a graph with a timestamp after each operation
    /// ([`CudaStep::timeline`]), all ranks at once so that their collectives meet; returns each
    /// rank's stamps, rank 0 first.
    pub fn timeline(&mut self, replays: usize) -> Result<Vec<Vec<u64>>, ExecError> {
        let n = self.ranks.len();
        let out: std::sync::Mutex<Vec<Option<Vec<u64>>>> = std::sync::Mutex::new(vec![None; n]);
        self.threads.on_every_rank(&mut self.ranks, |r, s| {
            let t = s.timeline(replays)?;
            out.lock().unwrap_or_else(|p| p.into_inner())[r] = Some(t);
            Ok(())
        })?;
        out.into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .map(|t| {
                t.ok_or_else(|| ExecError::Invalid {
                    op: "timeline",
                    reason: "a rank returned no stamps".into(),
                })
            })
            .collect()
    }
}
