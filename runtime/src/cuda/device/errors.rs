//! How a failed CUDA driver or cuBLAS call becomes an [`ExecError::Device`] naming what was
//! being done: a leaf the step's loading, running and diagnostics all report through.

use crate::error::ExecError;
use cudarc::cublas::sys as blas;
use cudarc::driver::result;

pub(super) fn driver(what: &str) -> impl FnOnce(result::DriverError) -> ExecError + '_ {
    move |e| ExecError::Device {
        what: what.into(),
        reason: e.to_string(),
    }
}

pub(super) fn cublas(what: &str, status: blas::cublasStatus_t) -> Result<(), ExecError> {
    if status == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(ExecError::Device {
            what: what.into(),
            reason: format!("{status:?}"),
        })
    }
}
