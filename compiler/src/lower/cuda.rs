//! Lowering a planned step to the CUDA backend's program: the device operations of one step,
//! in schedule order, each naming byte offsets inside the step's one allocation.
//!
//! This is host logic only (no device API), so every part of it is tested on machines without a
//! GPU: which kernel each node becomes, the cuBLAS parameters of each matmul, and that every
//! address a launch receives lies inside the allocation. The program is stored in the step
//! executable; the runtime compiles its kernels' source with NVRTC and replays its operations.
//!
//! A node becomes:
//! - a fused kernel ([`Op::Fused`](crate::ir::Op::Fused)): the launches of the CUDA C that
//!   [`ingot_kernels::cuda::fused_program`] generates from its description: one, pointers to
//!   its inputs then its outputs; or, for a column reduction too narrow to fill the GPU, a
//!   partial kernel writing partial sums into the node's planned workspace and a finish kernel
//!   folding them; for a reduction whose full outputs read its sums with too few rows to fill
//!   the GPU (batch norm over NCHW), a partial and a finish kernel a stage of reductions, the
//!   finished sums in the workspace, then an elementwise kernel writing the full outputs;
//! - a matmul: one cuBLAS strided-batched GEMM, its workspace the node's planned workspace in
//!   the slab; where its only reader adds a bias to it in place, the GEMM carries the bias as
//!   cuBLASLt's epilogue and the reader lowers to nothing ([`epilogue`]);
//! - gather, concat: one launch of a generated kernel; scatter-add: a memset of its output, the
//!   launches that sort its positions by id in its workspace, and one that sums into it;
//! - a convolution pass: one cuDNN convolution ([`conv::Conv`], its algorithm chosen when the
//!   step is loaded), holding as its fallback, per chunk of images, im2col (col2im) launches
//!   and cuBLAS GEMMs through a column buffer in its workspace; max pooling: one launch (the
//!   `window` module);
//! - attention: one launch of the fused forward kernel ([`ingot_kernels::cuda::attention`]);
//!   its backward pass three launches, with `delta` in the node's planned workspace;
//! - leaves, reshapes and kernel results: nothing (the host writes leaves; a reshape is a view;
//!   a result is written by its kernel).
//!
//! Any other op has no CUDA kernel: the CUDA backend runs fused steps, where every elementwise
//! op, view and reduction is inside a fused kernel.
//!
//! The module is in parts: [`workspace`] (the scratch each node is planned), [`program`] (the
//! program's format: device operations, kernels, dependencies), `check` (a program is sound
//! to run), [`gemm`] (the cuBLAS calls of a matmul), `lowering` (a planned graph into a
//! program) and `window` (convolutions and pooling).

mod check;
pub mod conv;
mod depthwise;
pub mod epilogue;
pub mod gemm;
mod lowering;
pub mod program;
mod window;
pub mod workspace;

pub use conv::{Conv, ConvPass};
pub use gemm::{Compute, Epilogue, Gemm, Leave, Round, Split, SPLIT_MIN};
pub(super) use lowering::lower;
pub use program::{DeviceOp, OpCounts, Program};
pub use workspace::{
    attention_shape, attention_supported, conv_least_bytes, conv_workspace, conv_workspace_least,
    conv_workspace_within, cudnn_least, kernel_shape, planned_conv_workspace, pool_pick_workspace,
    workspace_bytes, workspace_need, ConvWorkspace, COLUMN_BUDGET, CUBLAS_WORKSPACE, CUDNN_FLOOR,
};

#[cfg(test)]
mod conv_tests;
#[cfg(test)]
mod epilogue_tests;
#[cfg(test)]
mod tests;
