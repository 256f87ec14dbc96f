//! A value's type ([`TensorType`]): its shape and dtype, and the bytes it takes.

use super::shape::Shape;
use ingot_kernels::DType;
use serde::{Deserialize, Serialize};

/// The result type of a node: what shape inference computes and the verifier re-checks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub shape: Shape,
    pub dtype: DType,
}

impl TensorType {
    pub fn new(shape: impl Into<Shape>, dtype: DType) -> TensorType {
        TensorType {
            shape: shape.into(),
            dtype,
        }
    }

    /// Bytes of a value of this type. Every type in a graph has passed [`crate::ir::infer`],
    /// which refuses one whose size [`TensorType::checked_bytes`] cannot give, so this product
    /// does not overflow there.
    pub fn bytes(&self) -> usize {
        self.shape.numel() * self.dtype.size()
    }

    /// Bytes of a value of this type, or `None` when the element count or the byte count
    /// overflows, or exceeds `isize::MAX` (the most any one allocation can hold).
    pub fn checked_bytes(&self) -> Option<usize> {
        self.shape
            .dims()
            .iter()
            .try_fold(self.dtype.size(), |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= isize::MAX as usize)
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}
