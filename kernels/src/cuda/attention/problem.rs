//! A fused attention problem ([`AttentionShape`], [`AttentionPrecision`]) and why a kernel
//! may not exist for it ([`AttentionError`]).

use crate::attention::Layout;
use serde::{Deserialize, Serialize};

/// The arithmetic of a fused attention: what its matrix products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionPrecision {
    /// f32 storage, f32 FMA arithmetic (no tensor cores): the strict reference.
    F32,
    /// f32 storage; the products on TF32 tensor cores, f32 accumulation.
    Tf32,
    /// bf16 storage of q, k, v, out, dout, dq, dk, dv (`unsigned short` in memory); bf16
    /// tensor-core products with f32 accumulation; softmax in f32; p rounded to bf16 before
    /// p·v; each stored output rounded once, to nearest even.
    Bf16,
}

/// One fused attention problem set. Where the operands lie is [`AttentionShape::layout`]:
/// rows of `head_dim` contiguous elements, `seq_q` of them a problem for q, out, dout, dq and
/// `seq_k` for k, v, dk, dv, each problem's rows placed by the layout's strides; lse and delta
/// are f32 `[batch_heads, seq_q]`, contiguous, whatever the layout.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionShape {
    /// batch × heads: independent attention problems.
    pub batch_heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    /// Key `j` is visible to query `i` iff `j <= i` (top-left aligned); otherwise every key is.
    pub causal: bool,
    /// Multiplies `q·kᵀ` before the softmax.
    pub scale: f32,
    pub precision: AttentionPrecision,
    /// The strides of every operand: `layout.q` for q and dq, `layout.kv` for k, v, dk and dv,
    /// `layout.out` for out and dout ([`Layout::contiguous`] is
    /// `[batch_heads, seq, head_dim]`). Each pointer passed at launch is its operand's start
    /// (for [`Layout::packed`], k and v point at their slots), 16-byte aligned; the strides
    /// must be multiples of 16 bytes, and a row stride at least `head_dim`, or the kernels
    /// refuse the shape.
    pub layout: Layout,
}

/// Why no kernel exists for a shape (the compiler turns these into refusals at compile time).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttentionError {
    /// The kernels tile the head dim by 16 (the bf16 products' k) and hold up to 128 columns.
    #[error(
        "fused attention: head_dim {head_dim} has no CUDA kernel (supported: multiples of 16 \
         from 32 to 128: 32, 48, 64, 80, 96, 112, 128)"
    )]
    UnsupportedHeadDim { head_dim: usize },
    /// An extent of 0: nothing to attend over (or to).
    #[error("fused attention: {what} is 0; batch_heads, seq_q and seq_k must be at least 1")]
    Empty { what: &'static str },
    /// The scale is NaN or infinite (its bits, so that the error stays `Eq`).
    #[error(
        "fused attention: the scale {} is not finite",
        f32::from_bits(*scale_bits)
    )]
    NonFiniteScale { scale_bits: u32 },
    /// Row indices are 32-bit in the kernels, and a grid has at most 2^31 - 1 blocks.
    #[error("fused attention: {what} = {value} is more than the kernels index (at most {limit})")]
    TooLarge {
        what: &'static str,
        value: usize,
        limit: usize,
    },
    /// Problem `bh` is batch `bh / heads`, head `bh % heads`: `heads` must be at least 1 and
    /// divide `batch_heads`, or some problem has no batch and head.
    #[error(
        "fused attention: the layout's heads = {heads} does not split batch_heads = \
         {batch_heads} into batches (heads must be at least 1 and divide batch_heads)"
    )]
    Heads { heads: usize, batch_heads: usize },
    /// The kernels load and store rows as 16-byte vectors: every stride (in elements) must be
    /// a multiple of 16 bytes' worth of elements, `elems` (8 for bf16, 4 for f32 and tf32).
    #[error(
        "fused attention: the {operand} {stride} stride {value} is not a multiple of {elems} \
         elements (16 bytes): the kernels move rows as 16-byte vectors"
    )]
    MisalignedStride {
        /// `q`, `kv` or `out` (the field of the layout).
        operand: &'static str,
        /// `batch`, `head` or `row`.
        stride: &'static str,
        value: usize,
        elems: usize,
    },
    /// A row stride below `head_dim` makes consecutive rows share elements: the kernels would
    /// read rows that run into each other and write outputs over each other.
    #[error(
        "fused attention: the {operand} row stride {row} is less than head_dim {head_dim}: \
         consecutive rows would overlap"
    )]
    OverlappingRows {
        /// `q`, `kv` or `out` (the field of the layout).
        operand: &'static str,
        row: usize,
        head_dim: usize,
    },
    /// No tiling fits the 48 KiB of shared memory a block may declare (no supported shape
    /// gets this; it guards the tile table).
    #[error(
        "fused attention: no tiling of the {kernel} kernel for head_dim {head_dim} fits in \
         48 KiB of shared memory"
    )]
    SharedMemory {
        kernel: &'static str,
        head_dim: usize,
    },
}
