//! Offload on the GPU ([`ingot_compiler::plan::offload`]): the offloaded leaves' homes in one
//! region of page-locked host memory, and their copies to and from the slab.
//!
//! The region is allocated once, when the step loads, as large as the plan's host region
//! (cached, so that reading every moment back for a checkpoint runs at memory speed), and
//! zeroed. Writing a leaf's value (its initial value, `--init`, a resume) writes its home, and
//! reading it (`--save`, a checkpoint) reads its home: between steps that is where the value
//! is, as on the CPU. Its device location is only a staging buffer in the slab.
//!
//! The copies ([`DeviceOp::CopyIn`], [`DeviceOp::CopyOut`]) are captured into the step's graph
//! on a stream of their own, forked from the step's stream at the first and joined back at the
//! end, each with the dependencies the lowering computed: a copy in after the last use of its
//! staging bytes and before the leaf's first reader, a copy out after its last writer and
//! before anything that takes the bytes next. In the graph they are memcpy nodes with those
//! edges, so the copy engine moves a moment while the compute around it runs.

use super::errors::driver;
use super::CudaStep;
use crate::error::ExecError;
use crate::tensor::Tensor;
use cudarc::driver::sys;
use ingot_compiler::ir::NodeId;
use ingot_compiler::lower::cuda::DeviceOp;
use ingot_compiler::lower::{CopyIn, CopyOut};
use ingot_compiler::plan::Location;

impl CudaStep {
    /// Where offloaded leaf `id` lives between steps: its home in the host region.
    pub(super) fn home(&self, id: NodeId) -> Option<Location> {
        let plan = self.main.exe.plan();
        plan.offload.iter().find(|o| o.leaf == id).map(|o| o.host)
    }

    /// Records offload copy `op` on stream `on` (captured: a memcpy node of the graph).
    pub(super) fn enqueue_offload_copy(
        &self,
        op: &DeviceOp,
        on: sys::CUstream,
    ) -> Result<(), ExecError> {
        let region = self.host.as_ref().ok_or_else(|| ExecError::Invalid {
            op: "offload copy",
            reason: "the program copies to host memory but the step holds no host region".into(),
        })?;
        let inside =
            |host: usize, bytes: usize| host.checked_add(bytes).is_some_and(|e| e <= region.len());
        match *op {
            DeviceOp::CopyIn(CopyIn {
                host, to, bytes, ..
            }) if inside(host, bytes) => {
                // SAFETY: the home lies inside the host region (checked) and the staging
                // buffer inside the allocation (the program's check); both live as long as the
                // graphs that copy between them.
                unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        self.base + to as u64,
                        region.base.add(host) as *const _,
                        bytes,
                        on,
                    )
                }
                .result()
                .map_err(driver("recording an offload copy in"))
            }
            DeviceOp::CopyOut(CopyOut {
                from, host, bytes, ..
            }) if inside(host, bytes) => {
                // SAFETY: as above; the host reads the region only after synchronizing.
                unsafe {
                    sys::cuMemcpyDtoHAsync_v2(
                        region.base.add(host) as *mut _,
                        self.base + from as u64,
                        bytes,
                        on,
                    )
                }
                .result()
                .map_err(driver("recording an offload copy out"))
            }
            _ => Err(ExecError::Invalid {
                op: "offload copy",
                reason: format!(
                    "{op:?} is not a copy inside the {} byte host region",
                    region.len()
                ),
            }),
        }
    }

    /// Writes `bytes` into home `h`, once no step is running.
    pub(super) fn write_home(&mut self, h: Location, bytes: &[u8]) -> Result<(), ExecError> {
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        self.stream.synchronize().map_err(driver("synchronizing"))?;
        let region = self.host.as_mut().ok_or_else(no_region)?;
        let to = region
            .buffer
            .as_mut()
            .get_mut(h.offset..h.offset + bytes.len())
            .ok_or_else(no_region)?;
        to.copy_from_slice(bytes);
        Ok(())
    }

    /// The value of offloaded leaf `id` from its home `h`, once no step is running.
    pub(super) fn read_home(&self, id: NodeId, h: Location) -> Result<Tensor, ExecError> {
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        self.stream.synchronize().map_err(driver("synchronizing"))?;
        let region = self.host.as_ref().ok_or_else(no_region)?;
        let from = region
            .buffer
            .get(h.offset..h.offset + h.bytes)
            .ok_or_else(no_region)?;
        Tensor::from_le_bytes(self.main.exe.graph().ty(id).clone(), from)
    }
}

fn no_region() -> ExecError {
    ExecError::Invalid {
        op: "offload",
        reason: "an offloaded leaf's home lies outside the step's host region".into(),
    }
}
