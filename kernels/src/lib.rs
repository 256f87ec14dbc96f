//! Ingot's kernels: the scalar ops and element types, the fused-kernel description with its CPU
//! implementation, and CPU matrix products. Nothing here knows the IR or touches a device.

pub mod attention;
pub mod cpu;
pub mod cuda;
pub mod dtype;
pub mod fused;
pub mod ops;
pub mod rng;

pub use dtype::DType;
pub use fused::FusedKernel;
pub use ops::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
