//! The stamps of a timeline capture ([`crate::cuda::timeline`]), which the step's graph capture
//! records after each operation.

use super::errors::driver;
use crate::error::ExecError;
use cudarc::driver::{result, sys, CudaFunction, CudaStream};
use std::ffi::c_void;
use std::sync::Arc;

/// A timeline capture's stamps ([`crate::cuda::timeline`]): the kernel, the highest-priority stream
/// it is captured on, and the buffer of one u64 slot per stamp.
pub(super) struct Stamps {
    pub(super) stream: Arc<CudaStream>,
    pub(super) function: CudaFunction,
    pub(super) base: sys::CUdeviceptr,
}

impl Stamps {
    /// Captures stamp `slot` on the stamps' stream, after its current capture dependencies.
    pub(super) fn stamp(&self, slot: usize) -> Result<(), ExecError> {
        let mut addr = self.base + 8 * slot as u64;
        let mut params = [&mut addr as *mut u64 as *mut c_void];
        // SAFETY: the kernel takes one device pointer; `slot` lies inside the buffer.
        unsafe {
            result::launch_kernel(
                self.function.cu_function(),
                (1, 1, 1),
                (1, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(driver("capturing a stamp"))
    }
}
