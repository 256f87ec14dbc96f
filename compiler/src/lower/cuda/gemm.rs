//! The cuBLAS calls of a matmul: a row-major batched product stated as the column-major GEMM
//! cuBLAS computes, its compute type, and its split where an operand has a zero triangle.

use crate::fuse::triangle::Triangle;
use crate::ir::{DType, NodeId};
use crate::plan::Location;
use crate::precision::Precision;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// A row-major batched matmul `C[b] = op(A[b]) · op(B[b])`, stated as the column-major GEMM
/// cuBLAS computes: row-major `C [m, n]` is column-major `Cᵀ [n, m]`, and `Cᵀ = op(B)ᵀ op(A)ᵀ`,
/// so cuBLAS's first operand is B and its second is A.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gemm {
    pub node: NodeId,
    /// The result's dtype, and the operands' except under [`Compute::Bf16InF32Out`] (whose
    /// operands are bf16, [`Gemm::operand_dtype`]).
    pub dtype: DType,
    /// The arithmetic cuBLAS computes in (chosen by the lowering from the step's precision).
    pub compute: Compute,
    /// cuBLAS's `transa` (applies to B) and `transb` (applies to A).
    pub trans_first: bool,
    pub trans_second: bool,
    /// cuBLAS's m, n, k: the row-major product's n, m, k.
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Leading dimensions of cuBLAS's first operand (B), second (A) and the result.
    pub ld_first: usize,
    pub ld_second: usize,
    pub ld_out: usize,
    /// Elements between consecutive matrices of the batch.
    pub stride_first: usize,
    pub stride_second: usize,
    pub stride_out: usize,
    pub batch: usize,
    /// Byte offsets of B, A and C.
    pub first: usize,
    pub second: usize,
    pub out: usize,
    pub workspace: Location,
    /// Whether the product is added to what `out` holds (cuBLAS's `beta = 1`; a convolution's
    /// weight gradient summed over chunks of images, a `matmul_acc`) rather than replacing it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accumulate: bool,
    /// Two calls that leave out an operand's zero triangle, where it has one ([`Split`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
    /// A bias added to every column of the result by cuBLASLt's epilogue, in place of the
    /// kernel that would add it after ([`Epilogue`], chosen by the lowering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epilogue: Option<Epilogue>,
}

/// cuBLASLt's `CUBLASLT_EPILOGUE_BIAS`: `out[i, j] = Σ_p op(first)[i, p]·op(second)[p, j] +
/// bias[i]` (cuBLAS's column-major view; the row-major result's columns), computed on the f32
/// accumulator and rounded to the result's dtype once. It stands in for a fused kernel that
/// adds a bias vector to the product and writes its sum over the product's own bytes
/// ([`super::epilogue`]); that kernel's launch is kept here, for a runtime whose cuBLASLt
/// refuses the epilogue, to run after a plain GEMM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Epilogue {
    /// Byte offset of the bias: `m` elements of `bias_dtype`.
    pub bias: usize,
    pub bias_dtype: DType,
    /// The fused node the epilogue absorbs, and its launch (kernel index and arguments).
    pub node: NodeId,
    pub kernel: usize,
    pub args: SmallVec<[usize; 8]>,
    /// Where the bias is an f32 parameter that the absorbed kernel rounds to bf16 (a bf16
    /// GEMM's; cuBLASLt 13 takes no f32 bias on a bf16 result): the launch that writes that
    /// rounding, `m` bf16 values, at [`Epilogue::bias`] in the tail of the GEMM's planned
    /// workspace just before the call. cuBLASLt's own workspace is then what lies before it
    /// ([`Gemm::library_workspace`]). The fallback (a plain GEMM, then the kernel) skips it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<Round>,
}

/// The launch of a kernel rounding an f32 bias to bf16 into a GEMM's workspace
/// ([`Epilogue::round`]): its arguments are the f32 bias and the bf16 copy, in that order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Round {
    pub kernel: usize,
    pub args: SmallVec<[usize; 8]>,
}

impl Gemm {
    /// The bytes of the planned workspace the library may use: all of it, except where a
    /// rounded bias lies in its tail ([`Epilogue::round`]), up to that bias.
    pub fn library_workspace(&self) -> usize {
        match &self.epilogue {
            Some(e) if e.round.is_some() => e.bias.saturating_sub(self.workspace.offset),
            _ => self.workspace.bytes,
        }
    }
}

/// A GEMM with a triangle of work to leave out ([`triangle`](crate::fuse::triangle)), computed as two calls: one of
/// its free indices (cuBLAS's n where `second`, else m) is cut in two at `at`, and each half
/// leaves out what [`Leave`] says, on its side of the diagonal. A causal attention's six
/// products each do a quarter less work: the four with its probabilities or their gradient
/// (zero above the diagonal), and the two that make its scores and the probabilities' gradient
/// (read only below it). Measured on an H100
/// (`scripts/kernel_experiment/causal_gemm.cu`, gpt2's `[96, 1024, 1024] x [96, 1024, 64]` and
/// `[96, 1024, 64] x [96, 64, 1024]`): two calls take 0.87 of one, four 0.87 to 0.92, eight
/// 0.99 to 1.05; so two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Split {
    /// Whether the cut index is cuBLAS's n (the second operand's, row-major A's rows), else m.
    pub second: bool,
    pub leave: Leave,
    /// Where the free index is cut.
    pub at: usize,
}

/// What each half of a [`Split`] leaves out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Leave {
    /// The operand whose free index is cut is zero on one side: `op(operand)[p, x]` (`x` the
    /// cut index) is zero where `p > x` (`p_exceeds`), else where `x > p`. Each half
    /// multiplies only the `p` (cuBLAS's k) the triangle does not zero; every output element is
    /// written.
    Contraction { p_exceeds: bool },
    /// Nothing reads the result on one side: where the other free index exceeds the cut one
    /// (`other_exceeds`), else the reverse. Each half computes only the rest of its columns;
    /// what is left out keeps the bytes it held.
    Output { other_exceeds: bool },
}

/// The smallest free extent and contraction a GEMM is split at: below it, a second launch
/// costs more than the triangle it leaves out (measured only at 1024, see [`Split`]).
pub const SPLIT_MIN: usize = 512;

/// The data and compute types of a GEMM: what cuBLAS's `cublasGemmStridedBatchedEx` is called
/// with (`CUDA_R_*` for the operands and the result, `CUBLAS_COMPUTE_*`, and alpha and beta of
/// the compute type's scalar).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compute {
    /// f32 operands and result, f32 arithmetic (`CUBLAS_COMPUTE_32F`).
    F32,
    /// f32 operands and result, TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    Tf32,
    /// f64 operands and result (`CUBLAS_COMPUTE_64F`).
    F64,
    /// bf16 operands and result (`CUDA_R_16BF`), f32 accumulation (`CUBLAS_COMPUTE_32F`,
    /// f32 alpha and beta); the result is rounded to bf16 once, when it is stored.
    Bf16F32,
    /// bf16 operands (`CUDA_R_16BF`), an f32 result (`CUDA_R_32F`), f32 accumulation
    /// (`CUBLAS_COMPUTE_32F`, f32 alpha and beta): a bf16 product added into an f32 sum
    /// (`matmul_acc`), never rounded to bf16.
    Bf16InF32Out,
}

impl Compute {
    /// The compute type of a matmul of `dtype` under `precision`: TF32 for f32 products only
    /// when the step asks for it; bf16 products always accumulate in f32.
    pub fn of(dtype: DType, precision: Precision) -> Option<Compute> {
        match (dtype, precision) {
            (DType::F32, Precision::Tf32) => Some(Compute::Tf32),
            (DType::F32, _) => Some(Compute::F32),
            (DType::F64, _) => Some(Compute::F64),
            (DType::BF16, _) => Some(Compute::Bf16F32),
            _ => None,
        }
    }
}

impl Gemm {
    /// The dtype of the two operands: bf16 under [`Compute::Bf16InF32Out`], else the result's.
    pub fn operand_dtype(&self) -> DType {
        match self.compute {
            Compute::Bf16InF32Out => DType::BF16,
            _ => self.dtype,
        }
    }

    /// The cuBLAS calls that compute this GEMM: itself, or the two halves of its [`Split`]
    /// (each with `split: None`).
    pub fn calls(&self) -> SmallVec<[Gemm; 2]> {
        let Some(s) = self.split else {
            return smallvec::smallvec![self.clone()];
        };
        let (eo, e) = (self.operand_dtype().size(), self.dtype.size());
        let (free, other) = if s.second {
            (self.n, self.m)
        } else {
            (self.m, self.n)
        };
        [(0, s.at), (s.at, free)]
            .into_iter()
            .map(|(x0, x1)| {
                // The contraction and the other free index this half needs.
                let (mut p, mut o) = ((0, self.k), (0, other));
                match s.leave {
                    Leave::Contraction { p_exceeds: true } => p.1 = x1.min(self.k),
                    Leave::Contraction { p_exceeds: false } => p.0 = x0.min(self.k),
                    Leave::Output {
                        other_exceeds: true,
                    } => o.1 = x1.min(other),
                    Leave::Output {
                        other_exceeds: false,
                    } => o.0 = x0.min(other),
                }
                // Column-major offsets of op(first)[i, p], op(second)[p, j] and out[i, j].
                let first = |i: usize, p: usize| {
                    if self.trans_first {
                        p + i * self.ld_first
                    } else {
                        i + p * self.ld_first
                    }
                };
                let second = |p: usize, j: usize| {
                    if self.trans_second {
                        j + p * self.ld_second
                    } else {
                        p + j * self.ld_second
                    }
                };
                let ((i0, i1), (j0, j1)) = if s.second {
                    (o, (x0, x1))
                } else {
                    ((x0, x1), o)
                };
                let mut c = self.clone();
                c.split = None;
                (c.m, c.n, c.k) = (i1 - i0, j1 - j0, p.1 - p.0);
                c.out += (i0 + j0 * self.ld_out) * e;
                c.first += first(i0, p.0) * eo;
                c.second += second(p.0, j0) * eo;
                c
            })
            .collect()
    }
}

/// The split of a GEMM whose row-major operands `a` (stored transposed where `ta`) and `b`
/// (`tb`) are zero in `zero` (a's first) and whose result nothing reads in `unread`: the first
/// of these that applies, where the extents reach `min`.
pub(super) fn split_of(
    g: &Gemm,
    (ta, tb): (bool, bool),
    zero: [Option<Triangle>; 2],
    unread: Option<Triangle>,
    min: usize,
) -> Option<Split> {
    use Triangle::{ZeroAbove, ZeroBelow};
    let split = |second: bool, leave: Leave| Split {
        second,
        leave,
        at: 0,
    };
    // Row-major A is cuBLAS's second operand, op(second)[p, j] = A[j, p]: stored as is, A's
    // zero-above (column p > row j) is p > j; transposed, the other way round. Row-major B is
    // the first, op(first)[i, p] = B[p, i]: stored as is, zero-below (row p > column i) is
    // p > i. The result C[j, i] is cuBLAS's out[i, j], cut along j (its rows): unread above
    // (column i > row j) is the other index exceeding.
    let candidates = [
        zero[0].map(|t| {
            let p_exceeds = (t == ZeroAbove) != ta;
            split(true, Leave::Contraction { p_exceeds })
        }),
        zero[1].map(|t| {
            let p_exceeds = (t == ZeroBelow) != tb;
            split(false, Leave::Contraction { p_exceeds })
        }),
        unread.map(|t| {
            let other_exceeds = t == ZeroAbove;
            split(true, Leave::Output { other_exceeds })
        }),
    ];
    candidates.into_iter().flatten().find_map(|s| {
        let (free, other) = if s.second { (g.n, g.m) } else { (g.m, g.n) };
        // The extent the other side of the diagonal runs along: the contraction, or the
        // result's other index.
        let along = match s.leave {
            Leave::Contraction { .. } => g.k,
            Leave::Output { .. } => other,
        };
        // Half, on a multiple of 64 (whole tiles) where the extent allows.
        let at = if free >= 128 {
            free / 2 / 64 * 64
        } else {
            free / 2
        };
        (free >= min && along >= min && at > 0 && at < along).then_some(Split { at, ..s })
    })
}
