//! `ingot train --gpus N`: data-parallel training on the GPUs of this machine over NCCL.
//!
//! `--gpus N` compiles the step for `N` data-parallel ranks (the gradient buckets' all-reduces
//! lowered to NCCL calls captured into each rank's step graph) and runs rank `r` on GPU `r`, one
//! thread per GPU ([`ingot_runtime::cuda::ranks::GpuRanks`]). `--gpus 1` is the single-GPU step (no
//! all-reduce, bit for bit) with NCCL found, loaded and given a one-rank communicator. Either
//! way NCCL's device memory is measured once at start and reported on its own line, outside
//! the plan (as the CUDA context is).

use super::device::Device;
use crate::failure::Failure;
use ingot_runtime::cuda::nccl;
use ingot_trainer::session::Session;

/// `--gpus n` against `--device` and the GPUs present: a clear error for every case that
/// cannot run.
pub fn check(n: u64, device: Option<Device>, ranks: u64) -> Result<(), Failure> {
    gpus_not_cpu_ranks("--gpus N", device, ranks)?;
    if n == 0 {
        return Err(Failure::new(2, "--gpus must be at least 1"));
    }
    let present = ingot_runtime::cuda::available().map_err(|e| Failure::new(1, e.to_string()))?;
    if n as usize > present {
        return Err(Failure::new(
            2,
            format!("--gpus {n}: this machine has {present} GPU(s)"),
        ));
    }
    Ok(())
}

/// `flag` (a data-parallel mode on GPUs) refuses the CPU and CPU ranks beside it.
fn gpus_not_cpu_ranks(flag: &str, device: Option<Device>, ranks: u64) -> Result<(), Failure> {
    if device == Some(Device::Cpu) {
        return Err(Failure::new(
            2,
            format!("{flag} trains on GPUs; for CPU ranks use --ranks N (without {flag})"),
        ));
    }
    if ranks > 1 {
        return Err(Failure::new(
            2,
            format!("give {flag} for GPUs or --ranks N for CPU ranks, not both"),
        ));
    }
    Ok(())
}

/// NCCL loaded, and this process's communicators with the device memory they took.
pub struct NcclRank {
    /// Held for the run: dropping it destroys the communicator (`--gpus 1`; the ranks of
    /// several GPUs hold their own).
    pub _comm: Option<nccl::Comm>,
    pub version: String,
    pub path: std::path::PathBuf,
    /// Per rank: free device memory before the communicators' creation (and connection)
    /// minus after (this process's rank alone with --torchrun).
    pub bytes: Vec<i64>,
    /// With --torchrun: this process's rank and the job's number of ranks.
    pub process: Option<(usize, usize)>,
    /// Whether the ranks' step memory is NCCL symmetric memory (see `cuda::nccl::SYMMETRIC`).
    pub symmetric: bool,
}

impl NcclRank {
    /// What ranks that hold their own communicators measured (`process`: `--torchrun`'s rank
    /// and number of ranks).
    fn measured(
        info: &ingot_runtime::cuda::ranks::NcclInfo,
        process: Option<(usize, usize)>,
    ) -> NcclRank {
        NcclRank {
            _comm: None,
            version: info.version.clone(),
            path: info.path.clone(),
            bytes: info.bytes.iter().map(|&b| b as i64).collect(),
            process,
            symmetric: info.symmetric,
        }
    }
}

/// What the GPU ranks of a session measured of NCCL ([`ingot_runtime::cuda::ranks::GpuRanks`]).
pub fn ranks_info(session: &Session) -> Option<NcclRank> {
    Some(NcclRank::measured(session.gpu_ranks()?.nccl(), None))
}

/// Loads NCCL (an error naming every directory looked in when it is absent) and makes the
/// one-rank communicator on the session's GPU, measuring the device memory it takes.
pub fn one_rank(session: &Session) -> Result<NcclRank, Failure> {
    let cuda = session
        .cuda()
        .ok_or_else(|| Failure::new(1, "--gpus needs the session on a GPU"))?;
    let lib = nccl::load().map_err(|e| Failure::new(1, format!("NCCL: {e}")))?;
    let version = lib.version().map_err(|e| Failure::new(1, e))?;
    let before = cuda.free_memory()? as i64;
    let mut comms = lib
        .init_all(&[cuda.ordinal() as i32])
        .map_err(|e| Failure::new(1, e))?;
    let after = cuda.free_memory()? as i64;
    let comm = comms
        .pop()
        .ok_or_else(|| Failure::new(1, "NCCL made no communicator"))?;
    Ok(NcclRank {
        _comm: Some(comm),
        version,
        path: lib.path.clone(),
        bytes: vec![before - after],
        process: None,
        symmetric: false,
    })
}

/// The line reporting NCCL's memory (text or a JSON line).
pub fn report(r: &NcclRank, json: bool) -> Result<(), Failure> {
    if json {
        let line = serde_json::json!({
            "nccl": {
                "version": r.version,
                "library": r.path.display().to_string(),
                "ranks": r.process.map_or(r.bytes.len(), |p| p.1),
                "rank": r.process.map(|p| p.0),
                "device_bytes": r.bytes,
                "symmetric_memory": r.symmetric,
            }
        });
        outln!("{line}")
    } else {
        let mib: Vec<String> = r
            .bytes
            .iter()
            .map(|&b| format!("{:.1}", b as f64 / (1u64 << 20) as f64))
            .collect();
        let who = match r.process {
            Some((rank, world)) => format!("rank {rank} of {world}, one process per GPU; its communicator took {} MiB of this GPU's memory", mib.join(" / ")),
            None => format!("{} rank(s), one per GPU; its communicator took {} MiB of device memory on each", r.bytes.len(), mib.join(" / ")),
        };
        let window = match r.symmetric {
            true => "; each rank's step memory is registered as an NCCL symmetric window",
            false => "",
        };
        outln!(
            "NCCL {} ({}): {who} (measured once at start, outside the plan){window}",
            r.version,
            r.path.display(),
        )
    }
}

/// `--torchrun`: the launch environment, after refusing what cannot go with it.
pub fn launch_env(
    device: Option<Device>,
    ranks: u64,
) -> Result<ingot_runtime::collective::launch::LaunchEnv, Failure> {
    gpus_not_cpu_ranks("--torchrun", device, ranks)?;
    ingot_runtime::collective::launch::LaunchEnv::from_env().map_err(|e| Failure::new(2, e))
}

/// What this process's rank measured of NCCL (`--torchrun`).
pub fn process_info(session: &Session) -> Option<NcclRank> {
    let r = session.process_rank()?;
    Some(NcclRank::measured(
        r.nccl(),
        Some((r.env().rank, r.env().world)),
    ))
}
