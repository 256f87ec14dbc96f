//! The offloaded leaves' homes ([`ingot_compiler::plan::offload`]): one region of page-locked
//! host memory as large as the plan's host region, allocated and zeroed when the step loads,
//! and the stream their copies are captured on (`super::offload` reads, writes and copies
//! them).

use super::errors::driver;
use crate::cuda::pinned::PinnedBuffer;
use crate::error::ExecError;
use cudarc::driver::{CudaContext, CudaStream};
use ingot_compiler::exe::Executable;
use std::sync::Arc;

/// The host region of an offloaded step and the stream its copies are captured on.
pub(super) struct HostRegion {
    pub(super) buffer: PinnedBuffer,
    /// The region's first byte (the buffer's, taken once so that a copy out can be recorded
    /// through `&self`).
    pub(super) base: *mut u8,
    pub(super) copies: Arc<CudaStream>,
}

impl HostRegion {
    /// The region's bytes (the plan's host region).
    pub(super) fn len(&self) -> usize {
        self.buffer.len()
    }
}

/// The host region `exe` needs, allocated and zeroed in `ctx`, with a stream for its copies;
/// `None` for a step that offloads nothing. An evaluation step `eval` loaded beside it has no
/// optimizer state to offload: one that does is refused.
pub(super) fn host_region(
    ctx: &Arc<CudaContext>,
    exe: &Executable,
    eval: Option<&Executable>,
) -> Result<Option<HostRegion>, ExecError> {
    if eval.is_some_and(|e| !e.plan().offload.is_empty()) {
        return Err(ExecError::Invalid {
            op: "load",
            reason: "the evaluation step offloads leaves to host memory; only a training \
                     step's optimizer state is offloaded"
                .into(),
        });
    }
    let plan = exe.plan();
    if plan.offload.is_empty() {
        return Ok(None);
    }
    let mut buffer = PinnedBuffer::readable(ctx, plan.host_bytes)?;
    let base = buffer.as_mut_ptr();
    let copies = ctx
        .new_stream()
        .map_err(driver("creating the offload copies' stream"))?;
    Ok(Some(HostRegion {
        buffer,
        base,
        copies,
    }))
}
