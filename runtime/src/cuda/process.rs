//! One rank of a data-parallel job of one process per GPU, started the way `torchrun` starts
//! jobs (`ingot train --torchrun`): this process drives GPU `LOCAL_RANK` and is rank `RANK` of
//! `WORLD_SIZE` ([`LaunchEnv`]). The processes meet over TCP at rank 0 ([`HostLink`]), which
//! hands out NCCL's unique id; each makes its communicator (`ncclCommInitRank`) and loads the
//! step as [`super::ranks::GpuRanks`] loads each of its ranks. Each process reads its own shard
//! of the data (the trainer's `data::shard::ShardBatches`); the loss each reports is the mean
//! over the ranks (exchanged over the link, a few bytes per step).

use super::device::{CudaOptions, CudaStep};
use super::nccl;
use super::ranks::NcclInfo;
use crate::collective::launch::{mean_of_ranks, HostLink, LaunchEnv};
use crate::collective::ranks::ranks_of;
use crate::error::ExecError;
use crate::executor::StepExecutor;
use crate::tensor::Tensor;
use cudarc::driver::{result, CudaContext};
use ingot_compiler::exe::{Executable, StepPair};
use ingot_compiler::ir::{DType, Graph, NodeId};
use ingot_compiler::plan::Location;
use ingot_compiler::plan::MemoryPlan;
use std::sync::Mutex;
use std::time::Duration;

/// How long the processes wait for each other to meet.
pub const MEET_TIMEOUT: Duration = Duration::from_secs(300);

/// This process's rank of the job.
pub struct ProcessRank {
    step: CudaStep,
    link: Mutex<HostLink>,
    env: LaunchEnv,
    nccl: NcclInfo,
}

fn device(what: &str) -> impl FnOnce(String) -> ExecError + '_ {
    move |reason| ExecError::Device {
        what: what.into(),
        reason,
    }
}

impl ProcessRank {
    /// Meets the other processes, makes this rank's NCCL communicator on GPU `LOCAL_RANK`, and
    /// loads `exe` (compiled for `WORLD_SIZE` ranks) there. Every process of the job calls it.
    pub fn new(exe: Executable, env: &LaunchEnv, serial: bool) -> Result<ProcessRank, ExecError> {
        let bytes = exe.plan().total_bytes;
        ProcessRank::load(exe, None, bytes, env, serial)
    }

    /// As [`ProcessRank::new`], with the pair's evaluation step beside the training step in
    /// one allocation: an evaluation runs on this process's shard of each validation batch,
    /// and its loss is averaged over the processes as the training loss is.
    pub fn pair(pair: StepPair, env: &LaunchEnv, serial: bool) -> Result<ProcessRank, ExecError> {
        let bytes = pair.allocation_bytes();
        let (train, eval, _) = pair.into_parts();
        ProcessRank::load(train, Some(eval), bytes, env, serial)
    }

    /// Loads `exe` (with `eval` beside it, in one allocation of `bytes`) as this process's rank.
    fn load(
        exe: Executable,
        eval: Option<Executable>,
        bytes: usize,
        env: &LaunchEnv,
        serial: bool,
    ) -> Result<ProcessRank, ExecError> {
        let ranks = ranks_of(&exe);
        if ranks != env.world {
            return Err(crate::collective::needs_collective(ranks, Some(env.world)));
        }
        let present = super::available()?;
        if env.local_rank >= present {
            return Err(device("loading the rank")(format!(
                "LOCAL_RANK={} but this host has {present} GPU(s)",
                env.local_rank
            )));
        }
        let lib = nccl::load().map_err(device("loading NCCL"))?;
        let version = lib.version().map_err(device("loading NCCL"))?;
        let ctx = CudaContext::new(env.local_rank)
            .map_err(|e| device("creating a context")(e.to_string()))?;
        let free = || -> Result<usize, ExecError> {
            ctx.bind_to_thread()
                .map_err(|e| device("binding")(e.to_string()))?;
            result::mem_get_info()
                .map(|(f, _)| f)
                .map_err(|e| device("reading free memory")(e.to_string()))
        };
        let before = free()?;
        let (link, payload) = HostLink::meet(
            env,
            || {
                let id = lib.unique_id()?;
                Ok(id.internal.iter().map(|&c| c as u8).collect())
            },
            MEET_TIMEOUT,
        )
        .map_err(device("meeting the other ranks"))?;
        if payload.len() != 128 {
            return Err(device("meeting the other ranks")(format!(
                "rank 0 sent a {}-byte id, not NCCL's 128",
                payload.len()
            )));
        }
        let mut id = nccl::UniqueId { internal: [0; 128] };
        for (d, &b) in id.internal.iter_mut().zip(&payload) {
            *d = b as std::ffi::c_char;
        }
        ctx.bind_to_thread()
            .map_err(|e| device("binding")(e.to_string()))?;
        let comm = lib
            .init_rank(env.world, id, env.rank)
            .map_err(device("making the NCCL communicator"))?;
        let after = free()?;
        let link = Mutex::new(link);
        let opts = CudaOptions {
            ordinal: env.local_rank,
            serial,
        };
        let step = CudaStep::rank_with(exe, eval, bytes, opts, comm, &|ok| {
            link.lock().map(|mut l| l.all_ok(ok)).unwrap_or(false)
        })?;
        let bytes = vec![before.saturating_sub(after) + step.memory().collectives];
        drop(ctx);
        let symmetric = step.symmetric();
        Ok(ProcessRank {
            step,
            link,
            env: env.clone(),
            nccl: NcclInfo {
                version,
                path: lib.path.clone(),
                bytes,
                symmetric,
            },
        })
    }

    /// The step on this process's GPU.
    pub fn step(&self) -> &CudaStep {
        &self.step
    }

    /// NCCL's version and path, and the memory this rank's communicator took.
    pub fn nccl(&self) -> &NcclInfo {
        &self.nccl
    }

    /// Where this process stands in the job.
    pub fn env(&self) -> &LaunchEnv {
        &self.env
    }
}

impl StepExecutor for ProcessRank {
    fn graph(&self) -> &Graph {
        self.step.graph()
    }

    fn plan(&self) -> &MemoryPlan {
        self.step.plan()
    }

    fn write_at(&mut self, at: Location, bytes: &[u8]) -> Result<(), ExecError> {
        self.step.write_at(at, bytes)
    }

    fn read_node(&self, id: NodeId) -> Result<Tensor, ExecError> {
        self.step.read_node(id)
    }

    fn step(&mut self) -> Result<(), ExecError> {
        self.step.step()
    }

    fn step_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        self.step.step_with_inputs(inputs)
    }

    fn eval_executable(&self) -> Option<&Executable> {
        self.step.eval_executable()
    }

    /// This process's shard of the batch (the evaluation has no collective; the loss is
    /// averaged over the processes where it is read, [`StepExecutor::read_scalar`]).
    fn eval_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        self.step.eval_with_inputs(inputs)
    }

    fn allocated_bytes(&self) -> usize {
        self.step.allocated_bytes()
    }

    fn device(&self) -> String {
        format!(
            "{}, rank {} of {} (one process per GPU)",
            self.step.device(),
            self.env.rank,
            self.env.world
        )
    }

    fn last_step_device_seconds(&self) -> Option<f64> {
        self.step.last_step_device_seconds()
    }

    /// This rank's value, averaged over the ranks through the link (every process reads the
    /// same scalars in the same order: the trainer is the same program on each).
    fn read_scalar(&self, at: Location, dtype: DType) -> Result<f64, ExecError> {
        let mine = self.step.read_scalar(at, dtype)?;
        let mut link = self.link.lock().map_err(|_| ExecError::Invalid {
            op: "read_scalar",
            reason: "the link to the other ranks was poisoned by a panic".into(),
        })?;
        let all = link
            .all_gather_f64(mine)
            .map_err(device("averaging a scalar over the ranks"))?;
        Ok(mean_of_ranks(&all))
    }

    fn data_ranks(&self) -> usize {
        self.env.world
    }

    fn data_shard(&self) -> Option<(usize, usize)> {
        Some((self.env.rank, self.env.world))
    }
}
