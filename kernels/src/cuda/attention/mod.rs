//! Fused attention (FlashAttention-2): `softmax(scale · q·kᵀ [+ causal mask]) · v` in one
//! forward kernel that never stores the `[seq_q, seq_k]` scores, and a backward pass of three
//! kernels that recompute them tile by tile from each row's saved log-sum-exp.
//!
//! The API is fixed (the compiler's CUDA lowering calls it); the layouts and semantics are
//! stated on [`AttentionShape`], [`forward`] and [`backward`].
//!
//! # How the kernels work
//! - [`forward`] ([`forward.rs`](forward)): a block per (query tile, batch·head); the query tile
//!   in shared memory, key and value tiles streamed through it, an online softmax in f32 (the
//!   running max and sum per row), only `lse` saved. Causal blocks stop at the diagonal tile;
//!   only tiles that cross the diagonal or the end of the keys are masked.
//! - [`backward`] ([`backward.rs`](backward)): `preprocess` (`delta = rowsum(dout ∘ out)`),
//!   `dkdv` (a block per key tile looping over query tiles) and `dq` (a block per query tile
//!   looping over key tiles): no atomics, every output element written once, so the results
//!   are the same bits on every run.
//! - Products (`helpers`): each warp owns 16 rows and computes its tiles with
//!   `mma.sync.m16n8k16` (bf16) or `mma.sync.m16n8k8` (tf32, operands rounded with
//!   `cvt.rna.tf32.f32`), f32 accumulation; strict f32 computes the same accumulator layout with
//!   one `fmaf` a term. The probabilities (and the backward's `ds`) go through a per-warp shared
//!   tile to become the next product's left operand (rounded to bf16 there for bf16).
//! - Tiles (`tiles`): four warps of 16 rows where 48 KiB of shared memory allow, fewer
//!   elsewhere, the step of each kernel as measured fastest on an H100 (bf16 head dim 64:
//!   64 × 64 forward and dq, 64 keys × 32 queries dkdv).
//! - Streamed tiles in bf16 arrive by `cp.async` ahead of their readers: the forward and dq
//!   issue one of the k/v tiles while the block computes with the other
//!   (`frame::key_tiles_pipelined`), dkdv holds two copies of its q/dout tiles where 48 KiB
//!   allow ([`Tiles::copies`]). f32 and tf32 load each tile between two barriers (tf32 rounds
//!   it on the way). The products and their order are the same either way: the same bits.
//! - Lengths that are not a multiple of a tile load zeros past the end and mask those keys (or
//!   queries, in `dkdv`); rows past the end are not stored.
//! - Addressing ([`crate::attention::Layout`]): a kernel splits its problem `bh` into batch
//!   `bh / heads` and head `bh % heads`, starts each operand at `batch·SB + head·SH` and steps
//!   its rows by the row stride, so token-major and packed q/k/v are read and written where
//!   they lie, without a transpose; lse and delta are contiguous in every layout.
//!
//! Every size, the layout's strides, the scale and the mask are literals; the text is
//! deterministic and its entry point is `ingot_{fnv1a64(text)}` as for the fused kernels. Each
//! kernel's text starts with the helpers behind include guards, so a module holding several of
//! them compiles.

use super::CudaKernel;
use crate::attention::Layout;
use serde::{Deserialize, Serialize};

mod backward;
mod common;
mod forward;
mod frame;
mod helpers;
mod tiles;

use common::Text;
pub use tiles::{choose as choose_tiles, TileKernel, Tiles, SHARED_LIMIT};

/// The tiling `kernel` of `s` uses (after the same checks as [`forward`] and [`backward`]):
/// what the codegen tests hold against the 48 KiB limit and the kernels' declarations.
#[doc(hidden)]
pub fn tiling(s: &AttentionShape, kernel: TileKernel) -> Result<Tiles, AttentionError> {
    common::check(s)?;
    common::tiles(s, kernel)
}

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

/// The forward kernel. Pointer parameters, in order: q, k, v, out, lse, where
/// `lse[i] = ln Σ_{j visible} exp(scale · q_i·k_j)`.
pub fn forward(s: &AttentionShape) -> Result<CudaKernel, AttentionError> {
    common::check(s)?;
    forward::generate(s, common::tiles(s, TileKernel::Forward)?)
}

/// One kernel of `s` (`TileKernel::Forward`, `Dkdv` or `Dq`) with the tiling of `warps` warps
/// and `inner`-row steps instead of the chosen one, for measuring tilings
/// (`attention_bench`); `None` where that tiling is not one the kernels take or does not fit.
#[doc(hidden)]
pub fn with_tiles(
    s: &AttentionShape,
    kernel: TileKernel,
    warps: usize,
    inner: usize,
) -> Result<Option<CudaKernel>, AttentionError> {
    common::check(s)?;
    let Some(t) = tiles::fixed(kernel, s.precision, s.head_dim, warps, inner) else {
        return Ok(None);
    };
    Ok(Some(match kernel {
        TileKernel::Forward => forward::generate(s, t)?,
        TileKernel::Dkdv => backward::dkdv(s, t)?,
        TileKernel::Dq => backward::dq(s, t)?,
    }))
}

/// The backward pass: three kernels, launched in field order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionBackward {
    /// Params: out, dout, delta, where `delta[i] = Σ_d dout[i,d]·out[i,d]` (f32).
    pub preprocess: CudaKernel,
    /// Params: q, k, v, dout, lse, delta, dk, dv.
    pub dkdv: CudaKernel,
    /// Params: q, k, v, dout, lse, delta, dq.
    pub dq: CudaKernel,
}

/// The backward kernels of `s`.
pub fn backward(s: &AttentionShape) -> Result<AttentionBackward, AttentionError> {
    common::check(s)?;
    Ok(AttentionBackward {
        preprocess: backward::preprocess(s)?,
        dkdv: backward::dkdv(s, common::tiles(s, TileKernel::Dkdv)?)?,
        dq: backward::dq(s, common::tiles(s, TileKernel::Dq)?)?,
    })
}

/// Bytes of scratch the backward needs (delta, f32 `[batch_heads, seq_q]`), planned as the
/// backward node's workspace.
pub fn backward_workspace_bytes(s: &AttentionShape) -> usize {
    s.batch_heads * s.seq_q * 4
}
