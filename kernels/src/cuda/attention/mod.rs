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
//!   are the same bits on every run. [`DqKernel::StoredDs`] (bf16, off by default) has dkdv
//!   store its bf16 `ds` in the workspace after delta and dq multiply it by k
//!   (`ds.rs`) instead of recomputing the scores.
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

mod backward;
mod common;
mod ds;
mod forward;
mod frame;
mod helpers;
mod problem;
mod tiles;

pub use ds::{DqKernel, DS_BLOCK};
pub use problem::{AttentionError, AttentionPrecision, AttentionShape};
pub use tiles::{choose as choose_tiles, TileKernel, Tiles, SHARED_LIMIT};

/// The tiling `kernel` of `s` uses (after the same checks as [`forward`] and [`backward`]):
/// what the codegen tests hold against the 48 KiB limit and the kernels' declarations.
#[doc(hidden)]
pub fn tiling(s: &AttentionShape, kernel: TileKernel) -> Result<Tiles, AttentionError> {
    common::check(s)?;
    common::tiles(s, kernel)
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
        TileKernel::Dkdv => backward::dkdv(s, t, false)?,
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

/// What [`backward`] and the compiler's lowering use: `Recompute`. `StoredDs` measured slower
/// as a whole on an H200 (session 44, GPT-2's B=8, H=12, T=1024, D=64 causal bf16: dkdv 0.168
/// -> 0.242 ms, dq 0.112 -> 0.053 ms, the backward 0.287 -> 0.306 ms).
pub const DEFAULT_DQ: DqKernel = DqKernel::Recompute;

/// The backward kernels of `s` ([`DEFAULT_DQ`]).
pub fn backward(s: &AttentionShape) -> Result<AttentionBackward, AttentionError> {
    backward_with(s, DEFAULT_DQ)
}

/// The backward kernels of `s` with `dq` computed as `how` says; its workspace is
/// [`backward_workspace_bytes_with`] of the same `how`.
pub fn backward_with(
    s: &AttentionShape,
    how: DqKernel,
) -> Result<AttentionBackward, AttentionError> {
    common::check(s)?;
    let stored = ds::stored(s, how);
    Ok(AttentionBackward {
        preprocess: backward::preprocess(s)?,
        dkdv: backward::dkdv(s, common::tiles(s, TileKernel::Dkdv)?, stored)?,
        dq: if stored {
            ds::dq(s)?
        } else {
            backward::dq(s, common::tiles(s, TileKernel::Dq)?)?
        },
    })
}

/// Bytes of scratch the backward of [`backward`] needs ([`backward_workspace_bytes_with`] of
/// [`DEFAULT_DQ`]).
pub fn backward_workspace_bytes(s: &AttentionShape) -> usize {
    backward_workspace_bytes_with(s, DEFAULT_DQ)
}

/// Bytes of scratch the backward needs, planned as the backward node's workspace and passed
/// to the kernels as `delta`: delta, f32 `[batch_heads, seq_q]`; where `ds` is stored, then,
/// from the next multiple of 256 bytes ([`backward_ds_offset`]), the bf16 `ds` that dkdv
/// writes and dq reads ([`backward_ds_bytes_with`]).
pub fn backward_workspace_bytes_with(s: &AttentionShape, how: DqKernel) -> usize {
    let delta = s.batch_heads * s.seq_q * 4;
    match backward_ds_bytes_with(s, how) {
        0 => delta,
        ds => ds::offset_bytes(s).saturating_add(ds),
    }
}

/// Bytes of the stored `ds` of [`backward`] (0 unless [`DEFAULT_DQ`] stores it and `s` is
/// bf16).
pub fn backward_ds_bytes(s: &AttentionShape) -> usize {
    backward_ds_bytes_with(s, DEFAULT_DQ)
}

/// Bytes of the stored `ds` (0 unless `how` is `StoredDs` and `s` is bf16).
pub fn backward_ds_bytes_with(s: &AttentionShape, how: DqKernel) -> usize {
    if ds::stored(s, how) {
        ds::scratch_bytes(s)
    } else {
        0
    }
}

/// Where the stored `ds` starts in the backward's workspace, in bytes (after delta, 256-byte
/// aligned).
pub fn backward_ds_offset(s: &AttentionShape) -> usize {
    ds::offset_bytes(s)
}
