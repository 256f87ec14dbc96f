//! Fused attention (FlashAttention-2): `softmax(scale · q·kᵀ [+ causal mask]) · v` in one
//! forward kernel that never stores the `[seq_q, seq_k]` scores, and a backward pass of three
//! kernels that recompute them tile by tile from each row's saved log-sum-exp.
//!
//! The API is fixed (the compiler's CUDA lowering calls it); the layouts and semantics are
//! stated on [`AttentionShape`], [`forward`] and [`backward`].

use super::CudaKernel;
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

/// One fused attention problem set. Layouts (contiguous, row-major): q, out, dout, dq
/// `[batch_heads, seq_q, head_dim]`; k, v, dk, dv `[batch_heads, seq_k, head_dim]`; lse and
/// delta f32 `[batch_heads, seq_q]`.
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
}

/// Why no kernel exists for a shape.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttentionError {
    #[error("fused attention has no CUDA kernel yet")]
    NotBuilt,
}

/// The forward kernel. Pointer parameters, in order: q, k, v, out, lse, where
/// `lse[i] = ln Σ_{j visible} exp(scale · q_i·k_j)`.
pub fn forward(s: &AttentionShape) -> Result<CudaKernel, AttentionError> {
    let _ = s;
    Err(AttentionError::NotBuilt)
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
    let _ = s;
    Err(AttentionError::NotBuilt)
}

/// Bytes of scratch the backward needs (delta, f32 `[batch_heads, seq_q]`), planned as the
/// backward node's workspace.
pub fn backward_workspace_bytes(s: &AttentionShape) -> usize {
    s.batch_heads * s.seq_q * 4
}
