//! CPU kernels on plain row-major slices: matrix products, strided copies (transpose,
//! broadcast, slice) and reductions. Nothing here knows the IR; shapes are explicit arguments.
//!
//! The functions allocate nothing on the heap for ranks up to [`layout::INLINE_RANK`]. Matrix
//! products come two ways: [`gemm()`] packs into a workspace the caller passes (the runtime plans
//! it in the slab, so a step allocates nothing), while [`matmul()`], over `matrixmultiply`,
//! allocates its packing buffers on every call and serves as an independent reference.
//! A caller that breaks a documented precondition (a slice of the wrong length) gets a panic
//! with a message; the runtime checks shapes before it calls in.

pub mod attention;
pub mod conv;
pub mod conv_geometry;
pub mod conv_nhwc;
pub mod conv_one_tap;
pub mod exp;
pub mod gemm;
pub mod layout;
pub mod matmul;
pub mod par;
pub mod pool;
pub mod reduce;
pub mod scalar;
pub mod tanh;
pub mod wide;

pub use gemm::{batched_matmul_ws, gemm_ws, workspace_len, GemmError};
pub use layout::{
    broadcast_strides, coalesce, numel, permuted, ravel, row_major_strides, strided_copy,
    transpose_2d, unravel, Dims, INLINE_RANK,
};
pub use matmul::{batched_matmul, gemm, matmul, GemmScalar, MatLayout, Trans};
pub use reduce::{max_run, reduce, reduce_rows, sum_run, ReduceKind};
pub use scalar::{Float, Num, Scalar};
