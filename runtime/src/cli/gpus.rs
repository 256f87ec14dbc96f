//! `ingot train --gpus N`: data-parallel training on the GPUs of this machine over NCCL.
//!
//! What runs today is one GPU: the step is the single-GPU step (no all-reduce, bit for bit), and
//! NCCL is found, loaded and given a one-rank communicator whose device memory is measured once
//! at start and reported on its own line, outside the plan (as the CUDA context is). Several
//! GPUs are refused, saying why: the CUDA lowering of the gradient buckets' all-reduce is not
//! built. The in-process CPU ranks (`--ranks N`) run the same data-parallel step today.

use super::train::Device;
use super::Failure;
use crate::cuda::nccl;
use crate::session::Session;

/// `--gpus n` against `--device` and the GPUs present: a clear error for every case that
/// cannot run.
pub fn check(n: u64, device: Option<Device>, ranks: u64) -> Result<(), Failure> {
    if device == Some(Device::Cpu) {
        return Err(Failure::new(
            2,
            "--gpus trains on GPUs; for CPU ranks use --ranks N (without --device cpu --gpus)",
        ));
    }
    if ranks > 1 {
        return Err(Failure::new(
            2,
            "give --gpus N for GPUs or --ranks N for CPU ranks, not both",
        ));
    }
    if n == 0 {
        return Err(Failure::new(2, "--gpus must be at least 1"));
    }
    let present = crate::cuda::available().map_err(|e| Failure::new(1, e.to_string()))?;
    if n as usize > present {
        return Err(Failure::new(
            2,
            format!("--gpus {n}: this machine has {present} GPU(s)"),
        ));
    }
    if n > 1 {
        return Err(Failure::new(
            2,
            format!(
                "--gpus {n} is not built yet: the CUDA lowering of the gradient buckets' \
                 all-reduce (NCCL on a stream of its own) is missing; --gpus 1 runs, and \
                 --ranks {n} runs the same data-parallel step on {n} CPU ranks"
            ),
        ));
    }
    Ok(())
}

/// NCCL loaded, and this process's communicator with the device memory it took.
pub struct NcclRank {
    /// Held for the run: dropping it destroys the communicator.
    pub _comm: nccl::Comm,
    pub version: String,
    pub path: std::path::PathBuf,
    /// Free device memory before the communicator's creation minus after.
    pub bytes: i64,
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
        _comm: comm,
        version,
        path: lib.path.clone(),
        bytes: before - after,
    })
}

/// The line reporting NCCL's memory (text or a JSON line).
pub fn report(r: &NcclRank, json: bool) -> Result<(), Failure> {
    if json {
        let line = serde_json::json!({
            "nccl": {
                "version": r.version,
                "library": r.path.display().to_string(),
                "ranks": 1,
                "device_bytes": r.bytes,
            }
        });
        crate::outln!("{line}")
    } else {
        crate::outln!(
            "NCCL {} ({}): 1 rank; its communicator took {:.1} MiB of device memory (measured once at start, outside the plan)",
            r.version,
            r.path.display(),
            r.bytes as f64 / (1u64 << 20) as f64
        )
    }
}
