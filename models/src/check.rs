//! The checks every model builder makes of its arguments, and the error that names the spec:
//! a leaf the builders and the spec reader share, so none reaches back into the crate root.

use ingot_compiler::error::{IrError, Result};
use ingot_compiler::ir::DType;

/// A model error naming the spec.
pub(super) fn model_err(spec: &str, reason: impl Into<String>) -> IrError {
    IrError::Model {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

/// Models train in floats; `f64` is for gradient checks.
pub(super) fn check_float(spec: &str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(model_err(
            spec,
            format!("models are built in f32 or f64, not {dtype}"),
        ))
    }
}

/// The product of `dims` times the widest element size (8 bytes), or an error when the tensor's
/// byte size would not fit in a `usize` (so no later pass overflows computing sizes).
pub(super) fn check_size(spec: &str, what: &str, dims: &[usize]) -> Result<()> {
    dims.iter()
        .try_fold(8usize, |acc, &d| acc.checked_mul(d))
        .map(|_| ())
        .ok_or_else(|| {
            model_err(
                spec,
                format!("{what} {dims:?} is too large: its size overflows"),
            )
        })
}
