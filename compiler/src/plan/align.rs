//! The alignment of every offset in a plan: a leaf the planner's parts and the lowering share.

/// Every offset in a plan is a multiple of this (what CUDA's allocator and vector loads like).
pub const ALIGNMENT: usize = 256;

/// Rounds `x` up to a multiple of [`ALIGNMENT`].
pub fn align_up(x: usize) -> usize {
    x.div_ceil(ALIGNMENT) * ALIGNMENT
}
