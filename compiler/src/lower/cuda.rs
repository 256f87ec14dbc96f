//! Lowering a planned step to the CUDA backend's program: the device operations of one step,
//! in schedule order, each naming byte offsets inside the step's one allocation.
//!
//! This is host logic only (no device API), so every part of it is tested on machines without a
//! GPU: which kernel each node becomes, the cuBLAS parameters of each matmul, and that every
//! address a launch receives lies inside the allocation. The program is stored in the step
//! executable; the runtime compiles its kernels' source with NVRTC and replays its operations.
//!
//! A node becomes:
//! - a fused kernel ([`Op::Fused`]): the launches of the CUDA C that
//!   [`ingot_kernels::cuda::fused_program`] generates from its description: one, pointers to
//!   its inputs then its outputs; or, for a column reduction too narrow to fill the GPU, a
//!   partial kernel writing partial sums into the node's planned workspace and a finish kernel
//!   folding them;
//! - a matmul: one cuBLAS strided-batched GEMM, its workspace the node's planned workspace in
//!   the slab;
//! - gather, concat: one launch of a generated kernel; scatter-add: a memset of its output, the
//!   launches that sort its positions by id in its workspace, and one that sums into it;
//! - a convolution: per chunk of images, im2col (col2im) launches and cuBLAS GEMMs through a
//!   column buffer in its workspace; max pooling: one launch (the `window` module);
//! - attention: one launch of the fused forward kernel ([`ingot_kernels::cuda::attention`]);
//!   its backward pass three launches, with `delta` in the node's planned workspace;
//! - leaves, reshapes and kernel results: nothing (the host writes leaves; a reshape is a view;
//!   a result is written by its kernel).
//!
//! Any other op has no CUDA kernel: the CUDA backend runs fused steps, where every elementwise
//! op, view and reduction is inside a fused kernel.

use super::deps::{self, Touch};
use super::LowerError;
use crate::ir::{DType, Graph, NodeId, Op};
use crate::plan::Location;
use crate::plan::MemoryPlan;
use crate::precision::Precision;
use ingot_kernels::cuda::attention::{self, AttentionPrecision, AttentionShape};
use ingot_kernels::cuda::{self as codegen, CudaKernel};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::collections::HashMap;

mod window;

use crate::fuse::triangle::{self, Triangle};
pub use window::{conv_workspace, ConvWorkspace, COLUMN_BUDGET};

/// Bytes of cuBLAS workspace planned for every matmul: what NVIDIA recommends on Hopper
/// (cuBLAS guide, `cublasSetWorkspace`). It lives in the slab only while its matmul runs.
pub const CUBLAS_WORKSPACE: usize = 32 << 20;

/// Scratch bytes each node needs on the CUDA target: a matmul's cuBLAS workspace; a fused
/// kernel split in two, its partial sums ([`codegen::fused_scratch_bytes`]); a scatter-add,
/// its ids sorted ([`codegen::scatter_add_scratch_bytes`]); other fused kernels keep
/// their intermediates in registers and need none.
pub fn workspace_bytes(g: &Graph, id: NodeId) -> usize {
    match g.node(id).op {
        Op::MatMul { .. } | Op::MatMulAcc { .. } => CUBLAS_WORKSPACE,
        Op::Attention { .. } | Op::AttentionGrad { .. } => attention_workspace(g, id).total,
        Op::Window(_) => conv_workspace(g, id).map_or(0, |w| w.total),
        Op::Fused(ref k) => codegen::fused_scratch_bytes(k),
        Op::ScatterAdd { rows } => {
            codegen::scatter_add_scratch_bytes(rows, g.ty(g.node(id).inputs[0]).shape.numel())
        }
        _ => 0,
    }
}

/// [`workspace_bytes`], and the operand that fills the workspace where one does: a
/// scatter-add's launches sort its ids there, which the step knows long before the values
/// to sum, so the sort runs beside the forward pass and only the sums wait for the values.
pub fn workspace_need(g: &Graph, id: NodeId) -> crate::plan::WorkspaceNeed {
    crate::plan::WorkspaceNeed {
        bytes: workspace_bytes(g, id),
        filled_from: match g.node(id).op {
            Op::ScatterAdd { .. } => Some(0),
            _ => None,
        },
    }
}

/// Where an attention node's workspace puts what its kernels need besides its planned
/// outputs: the backward pass's `delta` ([`attention::backward_workspace_bytes`]) first, then
/// each output no result node names ([`super::unnamed_outputs`]), which the kernels write all
/// the same; each region 256-byte aligned.
struct AttentionWorkspace {
    /// Byte offset of `delta` within the workspace (backward only).
    delta: Option<usize>,
    /// `(output index, offset within the workspace)` of each unnamed output.
    outputs: Vec<(usize, usize)>,
    total: usize,
}

fn attention_workspace(g: &Graph, id: NodeId) -> AttentionWorkspace {
    let align = |x: usize| x.div_ceil(256) * 256;
    let mut at = 0;
    let delta = match attention_shape(g, id, Precision::F32) {
        Some(s) if matches!(g.node(id).op, Op::AttentionGrad { .. }) => {
            at = align(attention::backward_workspace_bytes(&s));
            Some(0)
        }
        _ => None,
    };
    let outputs = super::unnamed_outputs(g, id)
        .into_iter()
        .map(|(i, t)| {
            let o = at;
            at += align(t.bytes());
            (i, o)
        })
        .collect();
    AttentionWorkspace {
        delta,
        outputs,
        total: at,
    }
}

/// The kernel API's description of attention node `id` under `precision` (`None` for another
/// op or operands that break the op's rules): f32 operands run as F32 or, when the step asks
/// for TF32, Tf32; bf16 operands as Bf16. The operands' layout comes from the op
/// ([`crate::ir::attention_problem`]).
pub fn attention_shape(g: &Graph, id: NodeId, precision: Precision) -> Option<AttentionShape> {
    let node = g.node(id);
    let types: SmallVec<[&crate::ir::TensorType; 6]> =
        node.inputs.iter().map(|&x| g.ty(x)).collect();
    let p = crate::ir::attention_problem(&node.op, &types).ok()?;
    Some(kernel_shape(&p, precision))
}

/// The kernel API's description of attention problem `p` under `precision` (see
/// [`attention_shape`]).
pub fn kernel_shape(p: &crate::ir::AttentionProblem, precision: Precision) -> AttentionShape {
    AttentionShape {
        batch_heads: p.batch_heads,
        seq_q: p.seq_q,
        seq_k: p.seq_k,
        head_dim: p.head_dim,
        causal: p.causal,
        scale: p.scale as f32,
        precision: match (p.dtype, precision) {
            (DType::BF16, _) => AttentionPrecision::Bf16,
            (_, Precision::Tf32) => AttentionPrecision::Tf32,
            _ => AttentionPrecision::F32,
        },
        layout: p.strides(),
    }
}

/// Whether the fused attention kernels exist for an attention shaped `c`, forward and backward,
/// in every precision (head dims the kernels were written for; sizes within their limits).
pub fn attention_supported(c: &crate::recognize::Candidate) -> bool {
    [
        AttentionPrecision::F32,
        AttentionPrecision::Tf32,
        AttentionPrecision::Bf16,
    ]
    .into_iter()
    .all(|precision| {
        let s = AttentionShape {
            batch_heads: c.batch_heads,
            seq_q: c.seq_q,
            seq_k: c.seq_k,
            head_dim: c.head_dim,
            causal: c.causal,
            scale: 1.0,
            precision,
            layout: ingot_kernels::attention::Layout::contiguous(c.seq_q, c.seq_k, c.head_dim),
        };
        attention::forward(&s).is_ok() && attention::backward(&s).is_ok()
    })
}

/// One device operation of a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DeviceOp {
    /// Launch kernel `kernel` of [`Program::kernels`] with these byte offsets as its pointer
    /// arguments, in the kernel's parameter order.
    Launch {
        node: NodeId,
        kernel: usize,
        args: SmallVec<[usize; 8]>,
    },
    Gemm(Gemm),
    /// Set `bytes` bytes at `offset` to zero.
    Zero {
        offset: usize,
        bytes: usize,
    },
    /// Copy `bytes` bytes from `from` to `to` (an update the plan could not place in place).
    Copy {
        from: usize,
        to: usize,
        bytes: usize,
    },
    /// Replace the `bytes` bytes of `dtype` elements at `offset` (one gradient bucket, a
    /// contiguous planned region) by their sum over the step's `ranks` data-parallel ranks
    /// (each rank's of its share of the loss: the mean): NCCL's in-place all-reduce with
    /// `ncclSum`, on the runtime's communicator. Every rank's
    /// program holds the same all-reduces in the same order, and each waits for the one before
    /// it (NCCL requires one order of collectives on every rank; two left unordered on parallel
    /// branches of the step's graph could run in different orders on two ranks and hang).
    AllReduce {
        node: NodeId,
        offset: usize,
        bytes: usize,
        dtype: DType,
        ranks: usize,
    },
    /// Every rank's `bytes` bytes at `from`, rank 0's first, into the `ranks * bytes` bytes at
    /// `to` (apart from `from`): NCCL's all-gather of bytes, on the runtime's communicator, in
    /// the one order of the program's collectives as [`DeviceOp::AllReduce`].
    AllGather {
        node: NodeId,
        from: usize,
        to: usize,
        bytes: usize,
        ranks: usize,
    },
    /// For each part, this rank's `bytes` bytes of the sum over the `ranks` ranks of the
    /// `ranks * bytes` bytes of `dtype` elements at `from`, into `to` (apart from every
    /// part's `from`): NCCL's reduce-scatter with `ncclSum`, one call per part launched
    /// together (one NCCL group), in the one order of the program's collectives as
    /// [`DeviceOp::AllReduce`].
    ReduceScatter {
        node: NodeId,
        parts: Vec<super::ScatterPart>,
        dtype: DType,
        ranks: usize,
    },
}

impl DeviceOp {
    /// The graph node the operation computes; `None` for a memset or a copy, which the lowering
    /// adds for a node's output or the step's end rather than computing one.
    pub fn node(&self) -> Option<NodeId> {
        match self {
            DeviceOp::Launch { node, .. }
            | DeviceOp::AllReduce { node, .. }
            | DeviceOp::AllGather { node, .. }
            | DeviceOp::ReduceScatter { node, .. } => Some(*node),
            DeviceOp::Gemm(gm) => Some(gm.node),
            DeviceOp::Zero { .. } | DeviceOp::Copy { .. } => None,
        }
    }

    /// True for the data-parallel collectives, which every rank runs in the same order.
    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            DeviceOp::AllReduce { .. }
                | DeviceOp::AllGather { .. }
                | DeviceOp::ReduceScatter { .. }
        )
    }
}

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
}

/// A GEMM with a triangle of work to leave out ([`triangle`]), computed as two calls: one of
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
fn split_of(
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

/// The device operations of one step and the kernels they launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Program {
    /// Source placed before the kernels in the module: the generator's prelude.
    pub prelude: String,
    /// Distinct kernels, each generated once (the same fused kernel in every layer is one).
    pub kernels: Vec<CudaKernel>,
    pub ops: Vec<DeviceOp>,
    /// The bytes each operation reads and writes (one per op).
    pub touches: Vec<Touch>,
    /// The earlier operations each one waits for ([`deps::dependencies`], one list per op).
    pub deps: Vec<SmallVec<[usize; 4]>>,
    /// Bytes of the one allocation every offset lies in.
    pub total_bytes: usize,
}

/// Lowers `g` under `plan` (validated by the caller, [`super::lower`]); `precision` picks the
/// GEMMs' compute types ([`Compute::of`]).
pub(super) fn lower(
    g: &Graph,
    plan: &MemoryPlan,
    precision: Precision,
) -> Result<Program, LowerError> {
    let mut p = Lowering {
        g,
        precision,
        location: g.ids().map(|id| plan.location(g, id)).collect(),
        kernels: Vec::new(),
        by_name: HashMap::new(),
        ops: Vec::new(),
        touches: Vec::new(),
        triangles: triangle::zero_triangles(g),
        unread: triangle::unread_triangles(g),
        filled: Default::default(),
    };
    let outputs = g.kernel_outputs();
    let after = early_fills(g, plan);
    for (pos, &id) in plan.liveness.order.iter().enumerate() {
        p.node(id, &outputs, plan)
            .map_err(|e| LowerError::at(g, id, e))?;
        for &s in after.get(&pos).into_iter().flatten() {
            p.fill(s, plan).map_err(|e| LowerError::at(g, s, e))?;
        }
    }
    for &(value, target) in &plan.liveness.copies {
        let (from, to) = (p.location[value.index()], p.location[target.index()]);
        if from.bytes > 0 {
            p.copy(
                from,
                Location {
                    offset: to.offset,
                    bytes: from.bytes,
                },
            );
        }
    }
    let mut deps = deps::dependencies(&p.touches);
    chain_collectives(&p.ops, &mut deps);
    let program = Program {
        prelude: codegen::prelude_for(&p.kernels),
        kernels: p.kernels,
        ops: p.ops,
        touches: p.touches,
        deps,
        total_bytes: plan.total_bytes,
    };
    program.check(plan.total_bytes)?;
    Ok(program)
}

/// How many of `program`'s launches, first, read only its first input and write only its
/// scratch: those that fill the workspace (a scatter-add's sort of its ids).
fn fill_launches(program: &codegen::FusedProgram) -> usize {
    (program.launches.iter())
        .take_while(|l| {
            l.args.iter().all(|a| match a {
                codegen::FusedArg::Input(i) => *i == 0,
                codegen::FusedArg::Output(_) => false,
                codegen::FusedArg::Scratch { .. } => true,
            })
        })
        .count()
}

/// The nodes whose workspace an operand fills ahead of them ([`workspace_need`]: a
/// scatter-add's sorted ids), by the schedule position after which the launches that fill it
/// are lowered: where the plan starts holding the workspace
/// ([`MemoryPlan::workspace_filled_after`], which the validator checks nothing else writes
/// from there to the node), when the operand is made by then. So those launches come early in
/// the program as well as in its dependencies, and the graph runs them beside the forward pass
/// rather than with the node's own launches. A plan that holds the workspace at the node alone
/// keeps them there.
fn early_fills(g: &Graph, plan: &MemoryPlan) -> HashMap<usize, Vec<NodeId>> {
    let mut after = HashMap::<usize, Vec<NodeId>>::new();
    for &id in &plan.liveness.order {
        let (Some(i), Some(at)) = (
            workspace_need(g, id).filled_from,
            plan.workspace_filled_after(id),
        ) else {
            continue;
        };
        let (lv, operand) = (&plan.liveness, g.node(id).inputs[i]);
        let region = lv.storages[lv.storage_of[operand.index()]].region;
        if crate::plan::liveness::made_at(g, &lv.position, region, operand) <= at {
            after.entry(at).or_default().push(id);
        }
    }
    after
}

/// Makes each collective wait for the one before it in program order, so every rank runs its
/// collectives in the program's one order ([`DeviceOp::AllReduce`]).
fn chain_collectives(ops: &[DeviceOp], deps: &mut [SmallVec<[usize; 4]>]) {
    let mut last = None;
    for (i, op) in ops.iter().enumerate() {
        if op.is_collective() {
            if let Some(prev) = last {
                if !deps[i].contains(&prev) {
                    deps[i].push(prev);
                }
            }
            last = Some(i);
        }
    }
}

impl Program {
    /// The CUDA C of the module holding every kernel: the shared prelude, then each kernel once.
    pub fn module_source(&self) -> String {
        let mut s = self.prelude.clone();
        for k in &self.kernels {
            s.push('\n');
            s.push_str(&k.source);
        }
        s
    }

    /// Kernel launches, GEMMs, memsets and copies per step.
    pub fn counts(&self) -> OpCounts {
        let mut c = OpCounts::default();
        for op in &self.ops {
            match op {
                DeviceOp::Launch { .. } => c.launches += 1,
                DeviceOp::Gemm(_) => c.gemms += 1,
                DeviceOp::Zero { .. } => c.memsets += 1,
                DeviceOp::Copy { .. } => c.copies += 1,
                DeviceOp::AllReduce { .. } => c.all_reduces += 1,
                DeviceOp::AllGather { .. } => c.all_gathers += 1,
                DeviceOp::ReduceScatter { .. } => c.reduce_scatters += 1,
            }
        }
        c
    }

    /// The program is sound to run in an allocation of `total_bytes`: its tables agree with
    /// each other (one touch and one dependency list per operation, every kernel index names
    /// a kernel, kernel names are distinct, launch shapes are launchable), every byte range an
    /// operation touches lies inside the allocation, and the dependency graph orders every pair
    /// of operations that share a byte one of them writes ([`deps::check`]). The plan's
    /// validator already checks buffers; this checks the lowering's own arithmetic (GEMM
    /// extents, kernel arguments) against the same bound, so a mistake here (or a damaged file)
    /// is an error, not a wild write.
    pub fn check(&self, total_bytes: usize) -> Result<(), LowerError> {
        let invalid = |reason: String| LowerError::Invalid {
            op: "cuda lowering",
            reason,
        };
        if self.total_bytes != total_bytes {
            return Err(invalid(format!(
                "the program is for an allocation of {} bytes, the plan's is {total_bytes}",
                self.total_bytes
            )));
        }
        if self.touches.len() != self.ops.len() {
            return Err(invalid(format!(
                "{} touch lists for {} operations",
                self.touches.len(),
                self.ops.len()
            )));
        }
        let mut names = std::collections::HashSet::new();
        for k in &self.kernels {
            if !names.insert(k.name.as_str()) {
                return Err(invalid(format!("kernel {} appears twice", k.name)));
            }
            let (grid, block) = (k.launch.grid, k.launch.block);
            let threads = block.iter().map(|&b| b as u64).product::<u64>();
            if grid.contains(&0) || block.contains(&0) || threads > 1024 {
                return Err(invalid(format!(
                    "kernel {} has launch shape grid {grid:?} block {block:?}: every dimension \
                     must be at least 1 and a block at most 1024 threads",
                    k.name
                )));
            }
        }
        for op in &self.ops {
            if let DeviceOp::Launch { kernel, .. } = op {
                if *kernel >= self.kernels.len() {
                    return Err(invalid(format!(
                        "a launch of kernel {kernel}, but the program has {}",
                        self.kernels.len()
                    )));
                }
            }
        }
        self.check_bounds()?;
        let collectives: Vec<usize> = (0..self.ops.len())
            .filter(|&i| self.ops[i].is_collective())
            .collect();
        if let Some(w) = collectives
            .windows(2)
            .find(|w| !self.deps.get(w[1]).is_some_and(|d| d.contains(&w[0])))
        {
            return Err(invalid(format!(
                "collective {} does not wait for collective {} before it: the ranks could run \
                 their collectives in different orders",
                w[1], w[0]
            )));
        }
        // A touch outside the allocation would make the dependency check meaningless.
        let inside = |l: &Location| {
            l.offset
                .checked_add(l.bytes)
                .is_some_and(|e| e <= total_bytes)
        };
        if !self
            .touches
            .iter()
            .all(|t| t.reads.iter().chain(&t.writes).all(inside))
        {
            return Err(invalid(
                "a touched byte range falls outside the allocation".into(),
            ));
        }
        deps::check(&self.touches, &self.deps).map_err(invalid)
    }

    /// Every byte range an operation touches lies inside the allocation.
    fn check_bounds(&self) -> Result<(), LowerError> {
        let fits = |offset: usize, bytes: usize| {
            offset
                .checked_add(bytes)
                .is_some_and(|end| end <= self.total_bytes)
        };
        let bad = |what: String| LowerError::Invalid {
            op: "cuda lowering",
            reason: format!(
                "{what} falls outside the {} bytes of the allocation",
                self.total_bytes
            ),
        };
        for op in &self.ops {
            match op {
                DeviceOp::Launch { node, args, .. } => {
                    if let Some(a) = args.iter().find(|&&a| a >= self.total_bytes.max(1)) {
                        return Err(bad(format!("an argument of node %{} at {a}", node.index())));
                    }
                }
                DeviceOp::Gemm(whole) => {
                    if let Some(sp) = whole.split {
                        let free = if sp.second { whole.n } else { whole.m };
                        if sp.at == 0 || sp.at >= free {
                            return Err(bad(format!(
                                "matmul node %{}: a split at {} of {free}",
                                whole.node.index(),
                                sp.at,
                            )));
                        }
                    }
                    let calls = whole.calls();
                    // A call with nothing to multiply would write zeros, not leave bytes.
                    if calls.len() > 1 && calls.iter().any(|c| c.m == 0 || c.n == 0 || c.k == 0) {
                        return Err(bad(format!(
                            "matmul node %{}: a split leaves a call empty",
                            whole.node.index(),
                        )));
                    }
                    for gm in &calls {
                        // A column-major `rows × cols` matrix of `e`-byte elements with leading
                        // dimension `ld`, `batch` times at `stride` elements apart, spans this
                        // many bytes.
                        let span =
                            |e: usize, stride: usize, rows: usize, cols: usize, ld: usize| {
                                if rows == 0 || cols == 0 || gm.batch == 0 {
                                    return 0;
                                }
                                ((gm.batch - 1) * stride + (cols - 1) * ld + rows) * e
                            };
                        // cuBLAS's first operand is m×k (k×m transposed); its second k×n (n×k).
                        let (fr, fc) = if gm.trans_first {
                            (gm.k, gm.m)
                        } else {
                            (gm.m, gm.k)
                        };
                        let (sr, sc) = if gm.trans_second {
                            (gm.n, gm.k)
                        } else {
                            (gm.k, gm.n)
                        };
                        let (eo, e) = (gm.operand_dtype().size(), gm.dtype.size());
                        let checks = [
                            (gm.first, span(eo, gm.stride_first, fr, fc, gm.ld_first)),
                            (gm.second, span(eo, gm.stride_second, sr, sc, gm.ld_second)),
                            (gm.out, span(e, gm.stride_out, gm.m, gm.n, gm.ld_out)),
                            (gm.workspace.offset, gm.workspace.bytes),
                        ];
                        if let Some((o, b)) = checks.iter().find(|(o, b)| !fits(*o, *b)) {
                            return Err(bad(format!(
                                "matmul node %{}: {b} bytes at {o}",
                                gm.node.index()
                            )));
                        }
                    }
                }
                DeviceOp::Zero { offset, bytes } => {
                    if !fits(*offset, *bytes) {
                        return Err(bad(format!("a memset of {bytes} bytes at {offset}")));
                    }
                }
                DeviceOp::Copy { from, to, bytes } => {
                    if !fits(*from, *bytes) || !fits(*to, *bytes) {
                        return Err(bad(format!("a copy of {bytes} bytes {from} -> {to}")));
                    }
                }
                DeviceOp::AllGather {
                    node,
                    from,
                    to,
                    bytes,
                    ranks,
                } => {
                    let all = bytes.checked_mul(*ranks).unwrap_or(usize::MAX);
                    if !fits(*from, *bytes) || !fits(*to, all) {
                        return Err(bad(format!(
                            "the all-gather of node %{}: {bytes} bytes at {from} into {to}",
                            node.index()
                        )));
                    }
                    if *from < to + all && *to < from + bytes {
                        return Err(bad(format!(
                            "the all-gather of node %{} onto its own operand",
                            node.index()
                        )));
                    }
                }
                DeviceOp::AllReduce {
                    node,
                    offset,
                    bytes,
                    ..
                } => {
                    if !fits(*offset, *bytes) {
                        return Err(bad(format!(
                            "the all-reduce of node %{}: {bytes} bytes at {offset}",
                            node.index()
                        )));
                    }
                }
                DeviceOp::ReduceScatter {
                    node, parts, ranks, ..
                } => {
                    // The parts run together: each output apart from every operand and from
                    // the other outputs.
                    let sent = |p: &super::ScatterPart| p.bytes.saturating_mul(*ranks);
                    if let Some(p) = parts
                        .iter()
                        .find(|p| !fits(p.from, sent(p)) || !fits(p.to, p.bytes))
                    {
                        return Err(bad(format!(
                            "the reduce-scatter of node %{}: {} bytes at {} into {}",
                            node.index(),
                            sent(p),
                            p.from,
                            p.to
                        )));
                    }
                    let apart = |a: usize, an: usize, b: usize, bn: usize| {
                        an == 0 || bn == 0 || a + an <= b || b + bn <= a
                    };
                    for (j, o) in parts.iter().enumerate() {
                        if parts.iter().any(|x| !apart(o.to, o.bytes, x.from, sent(x)))
                            || parts[j + 1..]
                                .iter()
                                .any(|o2| !apart(o.to, o.bytes, o2.to, o2.bytes))
                        {
                            return Err(LowerError::Invalid {
                                op: "cuda lowering",
                                reason: format!(
                                    "output {j} of the reduce-scatter of node %{} is placed over \
                                     an operand or another output",
                                    node.index()
                                ),
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl Program {
    /// A short text account of the program, stable across machines, for snapshots and
    /// `ingot inspect`: operation counts, the dependency graph's size and depth, the kernels'
    /// launch shapes, the GEMM shapes with their counts, and an FNV-1a-64 fingerprint of the
    /// whole program (every offset, argument and source byte), so that any change to the
    /// lowering shows as a changed line.
    pub fn summary(&self) -> String {
        use std::collections::BTreeMap;
        use std::fmt::Write as _;
        let c = self.counts();
        let edges: usize = self.deps.iter().map(|d| d.len()).sum();
        // The longest chain of operations each waiting for the one before (the critical path
        // in operations), and the most operations at one depth (how many may overlap).
        let mut depth = vec![0usize; self.ops.len()];
        for j in 0..self.ops.len() {
            depth[j] = self.deps[j]
                .iter()
                .map(|&i| depth[i] + 1)
                .max()
                .unwrap_or(0);
        }
        let mut per_depth: BTreeMap<usize, usize> = BTreeMap::new();
        for &d in &depth {
            *per_depth.entry(d).or_default() += 1;
        }
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} operations: {} kernel launches, {} GEMMs, {} memsets, {} copies",
            self.ops.len(),
            c.launches,
            c.gemms,
            c.memsets,
            c.copies
        );
        let _ = writeln!(
            out,
            "dependency graph: {edges} edges, {} operations deep, at most {} at one depth",
            per_depth.len(),
            per_depth.values().max().copied().unwrap_or(0)
        );
        let _ = writeln!(out, "allocation: {} bytes", self.total_bytes);
        let mut shapes: BTreeMap<String, usize> = BTreeMap::new();
        for k in &self.kernels {
            let l = k.launch;
            *shapes
                .entry(format!(
                    "grid {:?} block {:?} shared {}",
                    l.grid, l.block, l.shared_bytes
                ))
                .or_default() += 1;
        }
        let _ = writeln!(
            out,
            "{} distinct kernels, {} bytes of CUDA C with the prelude; launch shapes:",
            self.kernels.len(),
            self.prelude.len() + self.kernels.iter().map(|k| k.source.len()).sum::<usize>()
        );
        for (shape, n) in &shapes {
            let _ = writeln!(out, "  {n:4} x {shape}");
        }
        let mut gemms: BTreeMap<String, usize> = BTreeMap::new();
        for op in &self.ops {
            if let DeviceOp::Gemm(g) = op {
                let t = |x: bool| if x { 'T' } else { 'N' };
                *gemms
                    .entry(format!(
                        "{}{} {} m={} n={} k={} batch={}",
                        t(g.trans_first),
                        t(g.trans_second),
                        g.dtype,
                        g.m,
                        g.n,
                        g.k,
                        g.batch
                    ))
                    .or_default() += 1;
            }
        }
        let _ = writeln!(out, "GEMMs (cuBLAS column-major):");
        for (shape, n) in &gemms {
            let _ = writeln!(out, "  {n:4} x {shape}");
        }
        let json = serde_json::to_vec(self).unwrap_or_default();
        let _ = writeln!(out, "fingerprint: {:016x}", crate::files::fnv1a64(&json));
        out
    }
}

/// How many operations of each kind one step runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpCounts {
    pub launches: usize,
    pub gemms: usize,
    pub memsets: usize,
    pub copies: usize,
    /// Gradient buckets averaged over the data-parallel ranks (0 for one rank).
    pub all_reduces: usize,
    /// Gradient operands gathered from the data-parallel ranks (0 for one rank).
    pub all_gathers: usize,
    /// Gradient buckets of which each rank keeps its rows of the sum (a sharded optimizer's).
    pub reduce_scatters: usize,
}

struct Lowering<'g> {
    g: &'g Graph,
    precision: Precision,
    location: Vec<Location>,
    kernels: Vec<CudaKernel>,
    by_name: HashMap<String, usize>,
    ops: Vec<DeviceOp>,
    touches: Vec<Touch>,
    /// The zero triangle of each node's value ([`triangle::zero_triangles`]).
    triangles: Vec<Option<Triangle>>,
    /// The triangle of each matmul's result nothing reads ([`triangle::unread_triangles`]).
    unread: Vec<Option<Triangle>>,
    /// Nodes whose workspace was filled ahead of them ([`early_fills`]), with the launches of
    /// their program left for their turn.
    filled: HashMap<NodeId, codegen::FusedProgram>,
}

impl Lowering<'_> {
    fn node(
        &mut self,
        id: NodeId,
        outputs: &[SmallVec<[NodeId; 1]>],
        plan: &MemoryPlan,
    ) -> Result<(), LowerError> {
        let g = self.g;
        let node = g.node(id);
        let here = self.location[id.index()];
        let inputs: SmallVec<[usize; 8]> = node
            .inputs
            .iter()
            .map(|x| self.location[x.index()].offset)
            .collect();
        match &node.op {
            op if op.is_leaf() || op.is_alias() => Ok(()),
            Op::Result { .. } => Ok(()),
            Op::Fused(kernel) => {
                let outs = &outputs[id.index()];
                if outs.iter().all(|o| self.location[o.index()].bytes == 0) {
                    return Ok(());
                }
                self.fused(id, kernel, outs, plan)
            }
            Op::MatMul { ta, tb } => {
                self.not_in_place(id)?;
                let w = plan.workspace(id).ok_or_else(|| LowerError::Invalid {
                    op: "matmul",
                    reason: "the plan gives this matmul no cuBLAS workspace; plan the step with \
                             the CUDA target's options (Target::Cuda.plan_options())"
                        .into(),
                })?;
                let operands = [node.inputs[0], node.inputs[1]];
                let gemm = gemm(g, id, operands, (*ta, *tb), here.offset, w, self)?;
                if here.bytes > 0 {
                    self.ops.push(DeviceOp::Gemm(gemm));
                    // The workspace is scratch the call writes.
                    self.touched(id, smallvec::smallvec![here, w]);
                }
                Ok(())
            }
            Op::MatMulAcc { ta, tb } => {
                // `c + a·b`: cuBLAS adds the product into the result's bytes (beta = 1), which
                // hold `c`: the plan places the result over `c` where `c` dies here; elsewhere
                // `c` is copied there first. `a` and `b` never share its bytes.
                let (c, a, b) = (node.inputs[0], node.inputs[1], node.inputs[2]);
                let overlaps = |l: Location| {
                    l.bytes > 0
                        && here.bytes > 0
                        && l.offset < here.offset + here.bytes
                        && here.offset < l.offset + l.bytes
                };
                if let Some(x) = [a, b]
                    .into_iter()
                    .find(|x| overlaps(self.location[x.index()]))
                {
                    return Err(LowerError::Invalid {
                        op: "matmul_acc",
                        reason: format!(
                            "operand {x} shares bytes with the result; only the accumulator c \
                             may be under it"
                        ),
                    });
                }
                let w = plan.workspace(id).ok_or_else(|| LowerError::Invalid {
                    op: "matmul_acc",
                    reason: "the plan gives this matmul_acc no cuBLAS workspace; plan the step \
                             with the CUDA target's options (Target::Cuda.plan_options())"
                        .into(),
                })?;
                let mut gemm = gemm(g, id, [a, b], (*ta, *tb), here.offset, w, self)?;
                gemm.accumulate = true;
                if here.bytes > 0 {
                    let from = self.location[c.index()];
                    if from != here {
                        self.copy(from, here);
                    }
                    self.ops.push(DeviceOp::Gemm(gemm));
                    self.touched(id, smallvec::smallvec![here, w]);
                }
                Ok(())
            }
            Op::Gather => {
                self.not_in_place(id)?;
                let (table, ids) = (g.ty(node.inputs[0]), g.ty(node.inputs[1]));
                let rows = table.shape.dims().first().copied().unwrap_or(1);
                let row_len = table.shape.dims()[1..].iter().product();
                let k = codegen::gather(table.dtype, ids.dtype, rows, row_len, ids.shape.numel())
                    .map_err(codegen_error)?;
                if here.bytes > 0 {
                    let mut args = inputs;
                    args.push(here.offset);
                    self.launch(id, k, args, smallvec::smallvec![here]);
                }
                Ok(())
            }
            Op::ScatterAdd { .. } => {
                self.not_in_place(id)?;
                // What is left where the sort was lowered where the ids are made
                // ([`early_fills`]), else the whole program.
                let program = match self.filled.remove(&id) {
                    Some(rest) => rest,
                    None => self.scatter_program(id)?,
                };
                if here.bytes > 0 {
                    self.ops.push(DeviceOp::Zero {
                        offset: here.offset,
                        bytes: here.bytes,
                    });
                    self.touches.push(Touch {
                        reads: SmallVec::new(),
                        writes: smallvec::smallvec![here],
                    });
                    self.program(id, program, &[id], plan, "scatter_add", "its sorted ids")?;
                }
                Ok(())
            }
            Op::Dropout { p, salt } => {
                // Each thread reads x[e] before writing out[e]: in place is fine.
                let x = g.ty(node.inputs[0]);
                let k =
                    codegen::dropout(x.dtype, x.shape.numel(), *p, *salt).map_err(codegen_error)?;
                if here.bytes > 0 {
                    let mut args = inputs;
                    args.push(here.offset);
                    self.launch(id, k, args, smallvec::smallvec![here]);
                }
                Ok(())
            }
            Op::Concat { axis } => {
                self.not_in_place(id)?;
                let dims = node.ty.shape.dims();
                let outer: usize = dims[..*axis].iter().product();
                let widths: Vec<usize> = node
                    .inputs
                    .iter()
                    .map(|&x| g.ty(x).shape.dims()[*axis..].iter().product())
                    .collect();
                let k = codegen::concat(node.ty.dtype, outer, &widths).map_err(codegen_error)?;
                if here.bytes > 0 {
                    let mut args = inputs;
                    args.push(here.offset);
                    self.launch(id, k, args, smallvec::smallvec![here]);
                }
                Ok(())
            }
            Op::Attention { .. } | Op::AttentionGrad { .. } => self.attention(id, outputs, plan),
            Op::AllReduce { ranks } => self.all_reduce(id, *ranks, &outputs[id.index()]),
            Op::ReduceScatter { ranks } => self.reduce_scatter(id, *ranks, &outputs[id.index()]),
            Op::AllGather { ranks } => {
                self.not_in_place(id)?;
                let (from, to) = (
                    self.location[self.g.node(id).inputs[0].index()],
                    self.location[id.index()],
                );
                self.ops.push(DeviceOp::AllGather {
                    node: id,
                    from: from.offset,
                    to: to.offset,
                    bytes: from.bytes,
                    ranks: *ranks,
                });
                self.touches.push(Touch {
                    reads: smallvec::smallvec![from],
                    writes: smallvec::smallvec![to],
                });
                Ok(())
            }
            Op::Window(w) => self.window(id, w, plan, &inputs),
            op => Err(LowerError::Invalid {
                op: op.name(),
                reason: format!(
                    "the CUDA backend has no kernel for a lone `{}`; it runs fused steps, where \
                     every elementwise op, view and reduction is inside a fused kernel (compile \
                     with fusion on, the default)",
                    op.name()
                ),
            }),
        }
    }

    /// A fused kernel's launches ([`codegen::fused_program`]): one, or a split column
    /// reduction's two, whose partials lie in the node's planned workspace.
    fn fused(
        &mut self,
        id: NodeId,
        kernel: &ingot_kernels::FusedKernel,
        outs: &[NodeId],
        plan: &MemoryPlan,
    ) -> Result<(), LowerError> {
        let program = codegen::fused_program(kernel).map_err(codegen_error)?;
        self.program(id, program, outs, plan, "fused", "its partial sums")
    }

    /// Scatter-add `id`'s program ([`codegen::scatter_add_program`]).
    fn scatter_program(&self, id: NodeId) -> Result<codegen::FusedProgram, LowerError> {
        let (g, node) = (self.g, self.g.node(id));
        let Op::ScatterAdd { rows } = node.op else {
            unreachable!("scatter_program of a {}", node.op.name());
        };
        let (ids, values) = (g.ty(node.inputs[0]), g.ty(node.inputs[1]));
        let n = ids.shape.numel();
        let row_len = values.shape.numel().checked_div(n).unwrap_or(0);
        codegen::scatter_add_program(ids.dtype, values.dtype, node.ty.dtype, rows, row_len, n)
            .map_err(codegen_error)
    }

    /// The launches that fill node `id`'s workspace from its operand (a scatter-add's sort of
    /// its ids), lowered ahead of the node ([`early_fills`]).
    fn fill(&mut self, id: NodeId, plan: &MemoryPlan) -> Result<(), LowerError> {
        if self.location[id.index()].bytes == 0 {
            return Ok(());
        }
        let mut program = self.scatter_program(id)?;
        let rest = codegen::FusedProgram {
            launches: program.launches.split_off(fill_launches(&program)),
            scratch_bytes: program.scratch_bytes,
        };
        self.filled.insert(id, rest);
        self.program(id, program, &[id], plan, "scatter_add", "its sorted ids")
    }

    /// The launches of `program` for node `id` (a fused kernel's, or scatter-add's): each
    /// argument at the node's input, at output `outs[j]`, or in the node's planned workspace,
    /// which must hold the program's scratch (`scratch` says what it holds, for the error).
    fn program(
        &mut self,
        id: NodeId,
        program: codegen::FusedProgram,
        outs: &[NodeId],
        plan: &MemoryPlan,
        op: &'static str,
        scratch: &str,
    ) -> Result<(), LowerError> {
        let ws = plan.workspace(id);
        if program.scratch_bytes > ws.map_or(0, |w| w.bytes) {
            return Err(LowerError::Invalid {
                op,
                reason: format!(
                    "the plan gives this {op} kernel no {} bytes of workspace for {scratch}; \
                     plan the step with the CUDA target's options \
                     (Target::Cuda.plan_options())",
                    program.scratch_bytes
                ),
            });
        }
        let node = self.g.node(id);
        for l in program.launches {
            let at: Vec<Location> = (l.args.iter())
                .map(|a| match *a {
                    codegen::FusedArg::Input(n) => self.location[node.inputs[n].index()],
                    codegen::FusedArg::Output(j) => self.location[outs[j].index()],
                    codegen::FusedArg::Scratch { offset, bytes } => Location {
                        offset: ws.map_or(0, |w| w.offset) + offset,
                        bytes,
                    },
                })
                .collect();
            let touch = Touch {
                reads: at[..l.reads].iter().copied().collect(),
                writes: at[l.reads..].iter().copied().collect(),
            };
            let args = at.iter().map(|l| l.offset).collect();
            self.launch_touching(id, l.kernel, args, touch);
        }
        Ok(())
    }

    /// An attention op: one launch of the forward kernel (q, k, v, out, lse), or the backward
    /// pass's three launches (delta from out and dout into the workspace; then dk and dv; then
    /// dq). An output no result node names lands in the workspace. A shape the kernels do not
    /// support is refused here, at compile time, naming the reason.
    fn attention(
        &mut self,
        id: NodeId,
        outputs: &[SmallVec<[NodeId; 1]>],
        plan: &MemoryPlan,
    ) -> Result<(), LowerError> {
        let g = self.g;
        let node = g.node(id);
        let op = node.op.name();
        let types: Vec<&crate::ir::TensorType> = node.inputs.iter().map(|&x| g.ty(x)).collect();
        let problem = crate::ir::attention_problem(&node.op, &types)
            .map_err(|reason| LowerError::Invalid { op, reason })?;
        let shape = kernel_shape(&problem, self.precision);
        let refused = |e: attention::AttentionError| LowerError::Invalid {
            op,
            reason: format!("no fused attention kernel for {shape:?}: {e}"),
        };
        self.not_in_place(id)?;
        let layout = attention_workspace(g, id);
        let ws = plan.workspace(id);
        if layout.total > 0 && ws.is_none_or(|w| w.bytes < layout.total) {
            return Err(LowerError::Invalid {
                op,
                reason: format!(
                    "the plan gives this attention no {} bytes of workspace; plan the step with \
                     the CUDA target's options (Target::Cuda.plan_options())",
                    layout.total
                ),
            });
        }
        let in_ws = |offset: usize, bytes: usize| Location {
            offset: ws.map_or(0, |w| w.offset) + offset,
            bytes,
        };
        // Every output's bytes, by output index.
        let out_types = crate::ir::attention_outputs(&node.op, &types)
            .map_err(|reason| LowerError::Invalid { op, reason })?;
        let mut out: Vec<Location> = out_types.iter().map(|t| in_ws(0, t.bytes())).collect();
        for &o in &outputs[id.index()] {
            let index = match g.node(o).op {
                Op::Result { index } => index,
                _ => 0,
            };
            out[index] = self.location[o.index()];
        }
        for &(index, offset) in &layout.outputs {
            out[index] = in_ws(offset, out_types[index].bytes());
        }
        // Where q, k, v (and dq, dk, dv) start: their own buffers, or the slots of a packed one.
        let starts = problem.operand_starts();
        let elem = problem.dtype.size();
        let at = |l: Location, elems: usize| l.offset + elems * elem;
        let loc = |i: usize| self.location[node.inputs[i].index()];
        let n = problem.layout.inputs(); // the forward's operands; then out, lse, dout
        let [q, k, v] = starts.map(|(i, e)| at(loc(i), e));
        let args =
            |ls: &[Location]| -> SmallVec<[usize; 8]> { ls.iter().map(|l| l.offset).collect() };
        // What a launch reads of the forward's operands: each buffer once.
        let operands: SmallVec<[Location; 6]> = (0..n).map(loc).collect();
        match node.op {
            Op::Attention { .. } => {
                let kernel = attention::forward(&shape).map_err(refused)?;
                let mut a: SmallVec<[usize; 8]> = smallvec::smallvec![q, k, v];
                a.extend(out.iter().map(|l| l.offset));
                self.launch_touching(
                    id,
                    kernel,
                    a,
                    Touch {
                        reads: operands,
                        writes: out.iter().copied().collect(),
                    },
                );
            }
            _ => {
                let b = attention::backward(&shape).map_err(refused)?;
                let delta = in_ws(
                    layout.delta.unwrap_or(0),
                    attention::backward_workspace_bytes(&shape),
                );
                let [o, lse, dout] = [n, n + 1, n + 2].map(loc);
                let [dq, dk, dv] = starts.map(|(i, e)| at(out[i], e));
                self.launch_touching(
                    id,
                    b.preprocess,
                    args(&[o, dout, delta]),
                    Touch {
                        reads: smallvec::smallvec![o, dout],
                        writes: smallvec::smallvec![delta],
                    },
                );
                let mut reads = operands.clone();
                reads.extend([dout, lse, delta]);
                // dk, dv (their buffers: dq's too when packed, which the dq launch then follows).
                let grads = |slots: &[usize]| -> SmallVec<[Location; 2]> {
                    let mut w: SmallVec<[Location; 2]> = SmallVec::new();
                    for &s in slots {
                        let l = out[starts[s].0];
                        if !w.contains(&l) {
                            w.push(l);
                        }
                    }
                    w
                };
                self.launch_touching(
                    id,
                    b.dkdv,
                    smallvec::smallvec![q, k, v, dout.offset, lse.offset, delta.offset, dk, dv],
                    Touch {
                        reads: reads.clone(),
                        writes: grads(&[1, 2]).into_iter().collect(),
                    },
                );
                self.launch_touching(
                    id,
                    b.dq,
                    smallvec::smallvec![q, k, v, dout.offset, lse.offset, delta.offset, dq],
                    Touch {
                        reads,
                        writes: grads(&[0]).into_iter().collect(),
                    },
                );
            }
        }
        Ok(())
    }

    /// As [`Self::launch`], with what the launch touches given explicitly.
    /// Launches `k` with two pointer arguments: it reads `from` and writes `to`.
    fn launch_from_to(&mut self, node: NodeId, k: CudaKernel, from: Location, to: Location) {
        let touch = Touch {
            reads: smallvec::smallvec![from],
            writes: smallvec::smallvec![to],
        };
        self.launch_touching(node, k, smallvec::smallvec![from.offset, to.offset], touch);
    }

    fn launch_touching(
        &mut self,
        node: NodeId,
        k: CudaKernel,
        args: SmallVec<[usize; 8]>,
        touch: Touch,
    ) {
        self.touches.push(touch);
        let kernel = self.kernel_index(k);
        self.ops.push(DeviceOp::Launch { node, kernel, args });
    }

    /// The index of `k` in the program's kernels, adding it the first time.
    fn kernel_index(&mut self, k: CudaKernel) -> usize {
        match self.by_name.get(&k.name) {
            Some(&i) => i,
            None => {
                self.by_name.insert(k.name.clone(), self.kernels.len());
                self.kernels.push(k);
                self.kernels.len() - 1
            }
        }
    }

    /// Records what the op just pushed for `node` touches: it reads the node's operands and
    /// writes `writes`.
    fn touched(&mut self, node: NodeId, writes: SmallVec<[Location; 2]>) {
        let reads = self
            .g
            .node(node)
            .inputs
            .iter()
            .map(|x| self.location[x.index()])
            .collect();
        self.touches.push(Touch { reads, writes });
    }

    /// Adds a launch of `k` (generating each distinct kernel once) that reads `node`'s
    /// operands and writes `writes`.
    fn launch(
        &mut self,
        node: NodeId,
        k: CudaKernel,
        args: SmallVec<[usize; 8]>,
        writes: SmallVec<[Location; 2]>,
    ) {
        self.touched(node, writes);
        let kernel = self.kernel_index(k);
        self.ops.push(DeviceOp::Launch { node, kernel, args });
    }

    /// A device copy of `to.bytes` bytes from `from` to `to`, reading and writing those bytes.
    fn copy(&mut self, from: Location, to: Location) {
        self.ops.push(DeviceOp::Copy {
            from: from.offset,
            to: to.offset,
            bytes: to.bytes,
        });
        self.touches.push(Touch {
            reads: smallvec::smallvec![from],
            writes: smallvec::smallvec![to],
        });
    }

    /// A gradient bucket's all-reduce: each gradient the planner could not place in its slot of
    /// the bucket is copied there first, then the bucket's one contiguous region is averaged
    /// over the ranks in place ([`DeviceOp::AllReduce`]).
    fn all_reduce(&mut self, id: NodeId, ranks: usize, outs: &[NodeId]) -> Result<(), LowerError> {
        let node = self.g.node(id);
        let invalid = |reason: String| LowerError::Invalid {
            op: "all_reduce",
            reason,
        };
        if outs.len() != node.inputs.len() || outs.is_empty() {
            return Err(invalid(format!(
                "{} gradients in and {} out",
                node.inputs.len(),
                outs.len()
            )));
        }
        let mut end = None;
        for (&x, &o) in node.inputs.iter().zip(outs) {
            let (from, to) = (self.location[x.index()], self.location[o.index()]);
            // The validator placed them one after another, at aligned offsets with the
            // padding between them the collective's to clobber.
            if end.is_some_and(|e| to.offset < e) {
                return Err(invalid(format!(
                    "the bucket's gradients are not in order in one region: %{} starts at {} \
                     before the one before it ends, at {}",
                    o.index(),
                    to.offset,
                    end.unwrap_or(0)
                )));
            }
            end = Some(to.offset + to.bytes);
            if from != to && to.bytes > 0 {
                self.copy(from, to);
            }
        }
        let offset = self.location[outs[0].index()].offset;
        let region = Location {
            offset,
            bytes: end.unwrap_or(offset) - offset,
        };
        if region.bytes == 0 {
            return Ok(());
        }
        self.ops.push(DeviceOp::AllReduce {
            node: id,
            offset,
            bytes: region.bytes,
            dtype: node.ty.dtype,
            ranks,
        });
        self.touches.push(Touch {
            reads: smallvec::smallvec![region],
            writes: smallvec::smallvec![region],
        });
        Ok(())
    }

    /// A bucket's reduce-scatter: each output, a buffer of its own, gets this rank's rows of
    /// its operand's sum over the ranks ([`DeviceOp::ReduceScatter`]); it reads the operands
    /// and writes the outputs, so a later writer of an operand's bytes waits for it.
    fn reduce_scatter(
        &mut self,
        id: NodeId,
        ranks: usize,
        outs: &[NodeId],
    ) -> Result<(), LowerError> {
        let node = self.g.node(id);
        if outs.len() != node.inputs.len() || outs.is_empty() {
            return Err(LowerError::Invalid {
                op: "reduce_scatter",
                reason: format!("{} gradients in and {} out", node.inputs.len(), outs.len()),
            });
        }
        let (mut parts, mut touch) = (Vec::new(), Touch::default());
        for (&x, &o) in node.inputs.iter().zip(outs) {
            let (from, to) = (self.location[x.index()], self.location[o.index()]);
            if to.bytes == 0 {
                continue;
            }
            parts.push(super::ScatterPart {
                from: from.offset,
                to: to.offset,
                bytes: to.bytes,
            });
            touch.reads.push(from);
            touch.writes.push(to);
        }
        if parts.is_empty() {
            return Ok(());
        }
        self.ops.push(DeviceOp::ReduceScatter {
            node: id,
            parts,
            dtype: node.ty.dtype,
            ranks,
        });
        self.touches.push(touch);
        Ok(())
    }

    /// Library calls and the gather, scatter and concat kernels read operands that must not
    /// share bytes with their output (the planner places only elementwise values in place).
    fn not_in_place(&self, id: NodeId) -> Result<(), LowerError> {
        let here = self.location[id.index()];
        let overlaps = |l: Location| {
            l.bytes > 0
                && here.bytes > 0
                && l.offset < here.offset + here.bytes
                && here.offset < l.offset + l.bytes
        };
        match self
            .g
            .node(id)
            .inputs
            .iter()
            .position(|x| overlaps(self.location[x.index()]))
        {
            Some(i) => Err(LowerError::Invalid {
                op: self.g.node(id).op.name(),
                reason: format!(
                    "operand {i} shares bytes with the output; this op cannot run in place"
                ),
            }),
            None => Ok(()),
        }
    }
}

/// The cuBLAS call of node `id` (a matmul, or a matmul_acc's product) with operands
/// `[a, b]`: `[..., m, k] x [..., k, n] -> [..., m, n]`, with `ta` (`tb`) meaning `a` (`b`) is
/// stored with its last two axes swapped; the compute type from the operands' and result's
/// dtypes and the step's precision ([`Compute::of`], or [`Compute::Bf16InF32Out`] for bf16
/// operands with an f32 result).
fn gemm(
    g: &Graph,
    id: NodeId,
    [a_id, b_id]: [NodeId; 2],
    (ta, tb): (bool, bool),
    out: usize,
    workspace: Location,
    at: &Lowering<'_>,
) -> Result<Gemm, LowerError> {
    let node = g.node(id);
    let precision = at.precision;
    let inputs = [
        at.location[a_id.index()].offset,
        at.location[b_id.index()].offset,
    ];
    let (a, b) = (g.ty(a_id), g.ty(b_id));
    let (ad, bd, cd) = (a.shape.dims(), b.shape.dims(), node.ty.shape.dims());
    let bad = |reason: String| LowerError::Invalid {
        op: node.op.name(),
        reason,
    };
    if ad.len() < 2 || bd.len() != ad.len() || cd.len() != ad.len() {
        return Err(bad(format!(
            "operands {} and {} and result {} must have one rank of at least 2",
            a, b, node.ty
        )));
    }
    let r = ad.len();
    let (m, k) = if ta {
        (ad[r - 1], ad[r - 2])
    } else {
        (ad[r - 2], ad[r - 1])
    };
    let (kb, n) = if tb {
        (bd[r - 1], bd[r - 2])
    } else {
        (bd[r - 2], bd[r - 1])
    };
    if k != kb
        || cd[r - 2] != m
        || cd[r - 1] != n
        || ad[..r - 2] != bd[..r - 2]
        || ad[..r - 2] != cd[..r - 2]
    {
        return Err(bad(format!(
            "operands {a} (ta={ta}) and {b} (tb={tb}) do not give the result {}",
            node.ty
        )));
    }
    let compute = match (a.dtype, b.dtype, node.ty.dtype) {
        (DType::BF16, DType::BF16, DType::F32) => Some(Compute::Bf16InF32Out),
        (x, y, z) if x == z && y == z => Compute::of(z, precision),
        _ => None,
    };
    let Some(compute) = compute else {
        return Err(bad(format!(
            "cuBLAS multiplies f32, f64 or bf16 matrices of one dtype (or bf16 into f32), not \
             {} x {} -> {}",
            a.dtype, b.dtype, node.ty.dtype
        )));
    };
    let batch = ad[..r - 2].iter().product();
    let limit = i32::MAX as usize;
    if [m, n, k, batch].iter().any(|&x| x > limit) {
        return Err(bad(format!(
            "a dimension of {a} x {b} exceeds cuBLAS's 32-bit limit"
        )));
    }
    let mut gm = Gemm {
        node: id,
        dtype: node.ty.dtype,
        compute,
        trans_first: tb,
        trans_second: ta,
        m: n,
        n: m,
        k,
        ld_first: if tb { k } else { n },
        ld_second: if ta { m } else { k },
        ld_out: n,
        stride_first: k * n,
        stride_second: m * k,
        stride_out: m * n,
        batch,
        first: inputs[1],
        second: inputs[0],
        out,
        workspace,
        accumulate: false,
        split: None,
    };
    let zero = [at.triangles[a_id.index()], at.triangles[b_id.index()]];
    gm.split = split_of(&gm, (ta, tb), zero, at.unread[id.index()], SPLIT_MIN);
    Ok(gm)
}

fn codegen_error(e: codegen::CodegenError) -> LowerError {
    LowerError::Invalid {
        op: "cuda codegen",
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, Graph, Init};
    use crate::lower::Target;
    use crate::pipeline;

    fn plan_options() -> crate::plan::PlanOptions {
        Target::Cuda.plan_options()
    }

    fn cuda() -> pipeline::Options {
        pipeline::Options::for_target(Target::Cuda)
    }

    /// A causal attention over q, k, v inputs `[2, 3, 5, 32]` (a head size the kernels
    /// support), trained through a weight so that the step has its backward pass, compiled
    /// for CUDA with the attention explicit.
    fn attention_step(precision: crate::precision::Precision) -> pipeline::Compiled {
        attention_step_with_head(precision, 32)
    }

    fn attention_step_with_head(
        precision: crate::precision::Precision,
        head: usize,
    ) -> pipeline::Compiled {
        let mut g = Graph::new();
        let w = g
            .parameter("w", [2, 3, 5, head], DType::F32, Init::Normal { std: 1.0 })
            .unwrap();
        let x = g.input("x", [2, 3, 5, head], DType::F32).unwrap();
        let q = g.mul(x, w).unwrap();
        let o = g.attention(q, q, w, true, 0.25).unwrap();
        step_summing(g, o, precision)
    }

    /// The training step (SGD) of `g` with the sum of `o` as its loss, compiled for CUDA.
    fn step_summing(
        mut g: Graph,
        o: NodeId,
        precision: crate::precision::Precision,
    ) -> pipeline::Compiled {
        let l = g.sum_all(o).unwrap();
        g.set_output(crate::autodiff::LOSS, l).unwrap();
        let m = crate::models::Model {
            name: "attention".into(),
            graph: g,
            eval_graph: None,
            optimizer: crate::models::Optimizer::Sgd { lr: 0.1 },
            precision,
        };
        pipeline::compile(&m, &cuda()).unwrap()
    }

    /// The attention node and its backward node of `g`.
    fn attention_nodes(g: &Graph) -> (NodeId, NodeId) {
        let find = |f: fn(&Op) -> bool| g.ids().find(|&id| f(&g.node(id).op)).unwrap();
        (
            find(|o| matches!(o, Op::Attention { .. })),
            find(|o| matches!(o, Op::AttentionGrad { .. })),
        )
    }

    /// The arguments of each launch of `node` in `p`, in order.
    fn launches_of(p: &Program, node: NodeId) -> Vec<&SmallVec<[usize; 8]>> {
        p.ops
            .iter()
            .filter_map(|o| match o {
                DeviceOp::Launch { node: n, args, .. } if *n == node => Some(args),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_backward_attention_plans_its_delta_as_workspace_and_the_forward_none() {
        let c = attention_step(crate::precision::Precision::F32);
        let g = &c.graph;
        let find = |f: fn(&Op) -> bool| g.ids().find(|&id| f(&g.node(id).op)).unwrap();
        let fwd = find(|o| matches!(o, Op::Attention { .. }));
        let bwd = find(|o| matches!(o, Op::AttentionGrad { .. }));
        assert_eq!(workspace_bytes(g, fwd), 0);
        // delta: f32 [2·3, 5], rounded to 256 bytes.
        assert_eq!(workspace_bytes(g, bwd), 256);
        assert_eq!(c.plan.workspace(bwd).map(|w| w.bytes), Some(256));
        let s = attention_shape(g, bwd, crate::precision::Precision::Tf32).unwrap();
        assert_eq!(
            (
                s.batch_heads,
                s.seq_q,
                s.seq_k,
                s.head_dim,
                s.causal,
                s.scale
            ),
            (6, 5, 5, 32, true, 0.25)
        );
        assert_eq!(s.precision, AttentionPrecision::Tf32);
        let s = attention_shape(g, bwd, crate::precision::Precision::F32).unwrap();
        assert_eq!(s.precision, AttentionPrecision::F32);
    }

    #[test]
    fn the_plan_names_the_kernels_each_attention_runs_with_on_each_target() {
        let c = attention_step(crate::precision::Precision::Tf32);
        let cuda = crate::lower::attention_kernels(
            &c.graph,
            Target::Cuda,
            crate::precision::Precision::Tf32,
        );
        assert_eq!(cuda.len(), 2, "{cuda:?}");
        assert!(
            cuda[0].starts_with(
                "   1 x attention q f32[2,3,5,32] k,v [2,3,5,32] causal scale 0.25 -> cuda Tf32: "
            ),
            "{cuda:?}"
        );
        assert!(cuda[1].contains("attention_grad") && cuda[1].contains("-> cuda Tf32: "));
        assert!(cuda[0].contains("forward ingot_"), "{cuda:?}");
        assert!(cuda[1].contains("backward ingot_"), "{cuda:?}");
        let cpu = crate::lower::attention_kernels(
            &c.graph,
            Target::Cpu,
            crate::precision::Precision::F32,
        );
        assert!(cpu
            .iter()
            .all(|l| l.ends_with("-> cpu::attention (f32 arithmetic)")));
    }

    #[test]
    fn a_bf16_attention_runs_the_bf16_kernels() {
        let c = attention_step(crate::precision::Precision::Bf16);
        let g = &c.graph;
        let fwd = g
            .ids()
            .find(|&id| matches!(g.node(id).op, Op::Attention { .. }))
            .unwrap();
        let s = attention_shape(g, fwd, crate::precision::Precision::Bf16).unwrap();
        assert_eq!(s.precision, AttentionPrecision::Bf16);
    }

    /// A packed attention's launches point k and v (dk and dv) at their slots of the one
    /// `[B, T, 3, H, D]` buffer: `H·D` and `2·H·D` elements past q's (dq's) start.
    #[test]
    fn a_packed_attention_launches_on_the_slots_of_its_one_buffer() {
        let (b, t, h, d) = (2, 5, 2, 32);
        let mut g = Graph::new();
        let w = g
            .parameter("w", [b, t, 3, h, d], DType::F32, Init::Normal { std: 1.0 })
            .unwrap();
        let x = g.input("x", [b, t, 3, h, d], DType::F32).unwrap();
        let qkv = g.mul(x, w).unwrap();
        let o = g
            .attention_in(crate::ir::AttentionLayout::Packed, &[qkv], true, 0.25)
            .unwrap();
        assert_eq!(g.ty(o).shape.dims(), [b, t, h, d]);
        let c = step_summing(g, o, crate::precision::Precision::F32);
        let g = &c.graph;
        let (fwd, bwd) = attention_nodes(g);
        let exe = c.executable(Target::Cuda).unwrap();
        let crate::lower::Program::Cuda(p) = exe.program() else {
            panic!("a CUDA program")
        };
        let launches = |node: NodeId| launches_of(p, node);
        let slot = h * d * 4;
        let at = |id: NodeId| c.plan.location(g, id).offset;
        let f = launches(fwd);
        let q = at(g.node(fwd).inputs[0]);
        assert_eq!(f[0][..3], [q, q + slot, q + 2 * slot]);
        let bw = launches(bwd);
        assert_eq!(bw.len(), 3);
        let dq = at(bwd);
        // dkdv: q, k, v, dout, lse, delta, dk, dv; dq: q, k, v, dout, lse, delta, dq.
        assert_eq!(bw[1][..3], [q, q + slot, q + 2 * slot]);
        assert_eq!(bw[1][6..], [dq + slot, dq + 2 * slot]);
        assert_eq!(bw[2][6..], [dq]);
        let s = attention_shape(g, bwd, crate::precision::Precision::F32).unwrap();
        assert_eq!(
            s.layout,
            ingot_kernels::attention::Layout::packed(h, t, d),
            "{s:?}"
        );
    }

    #[test]
    fn attention_lowers_to_one_forward_launch_and_three_backward_launches_on_its_planned_bytes() {
        let c = attention_step(crate::precision::Precision::F32);
        let g = &c.graph;
        let (fwd, bwd) = attention_nodes(g);
        let exe = c.executable(Target::Cuda).unwrap();
        let crate::lower::Program::Cuda(p) = exe.program() else {
            panic!("a CUDA program")
        };
        let at = |id: NodeId| c.plan.location(g, id).offset;
        let launches = |node: NodeId| launches_of(p, node);
        let inputs =
            |id: NodeId| -> Vec<usize> { g.node(id).inputs.iter().map(|&x| at(x)).collect() };
        let lse = g.result_of(fwd, 1).unwrap();
        let mut want = inputs(fwd);
        want.extend([at(fwd), at(lse)]);
        assert_eq!(launches(fwd), vec![&SmallVec::<[usize; 8]>::from_vec(want)]);
        let b = launches(bwd);
        let i = inputs(bwd);
        let delta = c.plan.workspace(bwd).unwrap().offset;
        let (dk, dv) = (
            at(g.result_of(bwd, 1).unwrap()),
            at(g.result_of(bwd, 2).unwrap()),
        );
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].as_slice(), &[i[3], i[5], delta]);
        assert_eq!(
            b[1].as_slice(),
            &[i[0], i[1], i[2], i[5], i[4], delta, dk, dv]
        );
        assert_eq!(
            b[2].as_slice(),
            &[i[0], i[1], i[2], i[5], i[4], delta, at(bwd)]
        );
    }

    #[test]
    fn an_explicit_attention_of_a_head_size_without_a_cuda_kernel_is_refused_when_lowered_naming_it(
    ) {
        // Head size 8: the kernels cover 32..=128. Written explicitly, not recognized, so no
        // pass can keep it as plain math: compiling for CUDA refuses it before any step.
        let c = attention_step_with_head(crate::precision::Precision::F32, 8);
        let g = &c.graph;
        let fwd = g
            .ids()
            .find(|&id| matches!(g.node(id).op, Op::Attention { .. }))
            .unwrap();
        let e = c.executable(Target::Cuda).unwrap_err().to_string();
        assert!(
            e.contains(&format!("%{}", fwd.index()))
                && e.contains("(attention)")
                && e.contains("no fused attention kernel"),
            "{e}"
        );
    }

    /// What cuBLAS's strided-batched GEMM computes (column-major, as its documentation states),
    /// over f32 values at byte offsets of one memory: an independent model of the library.
    fn cublas_gemm(mem: &mut [f32], g: &Gemm) {
        let at = |o: usize| o / 4;
        for b in 0..g.batch {
            for j in 0..g.n {
                for i in 0..g.m {
                    let mut acc = 0.0f64;
                    for p in 0..g.k {
                        // op(first)[i, p] and op(second)[p, j], column-major.
                        let f = if g.trans_first {
                            mem[at(g.first) + b * g.stride_first + i * g.ld_first + p]
                        } else {
                            mem[at(g.first) + b * g.stride_first + p * g.ld_first + i]
                        };
                        let s = if g.trans_second {
                            mem[at(g.second) + b * g.stride_second + p * g.ld_second + j]
                        } else {
                            mem[at(g.second) + b * g.stride_second + j * g.ld_second + p]
                        };
                        acc += f as f64 * s as f64;
                    }
                    mem[at(g.out) + b * g.stride_out + j * g.ld_out + i] = acc as f32;
                }
            }
        }
    }

    #[test]
    fn every_matmul_flag_combination_becomes_the_gemm_that_computes_it() {
        // [2, m, k] x [2, k, n] for m, k, n = 3, 4, 5, stored transposed where a flag says so.
        let (m, k, n) = (3, 4, 5);
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let (g, plan, gemm, [a, b, c]) = one_gemm((m, k, n), (ta, tb));
            let gemm = &gemm;
            assert_eq!(gemm.workspace.bytes, CUBLAS_WORKSPACE);

            let mut mem = vec![0f32; plan.total_bytes / 4];
            let value = |i: usize| ((i * 7 + 3) % 11) as f32 - 5.0;
            let (la, lb) = (plan.location(&g, a), plan.location(&g, b));
            for i in 0..2 * m * k {
                mem[la.offset / 4 + i] = value(i);
            }
            for i in 0..2 * k * n {
                mem[lb.offset / 4 + i] = value(i + 100);
            }
            cublas_gemm(&mut mem, gemm);
            let lc = plan.location(&g, c);
            for bt in 0..2 {
                for i in 0..m {
                    for j in 0..n {
                        let mut want = 0.0;
                        for p in 0..k {
                            let ai = if ta { p * m + i } else { i * k + p };
                            let bi = if tb { j * k + p } else { p * n + j };
                            want += value(bt * m * k + ai) * value(bt * k * n + bi + 100);
                        }
                        let got = mem[lc.offset / 4 + bt * m * n + i * n + j];
                        assert_eq!(got, want, "ta={ta} tb={tb} batch {bt} [{i}, {j}]");
                    }
                }
            }
        }
    }

    /// `whole` cut by `split`, each of its calls run by the cuBLAS model over a copy of `mem`:
    /// the memory after, and the calls' multiply-adds.
    fn split_calls(mem: &[f32], whole: &Gemm, split: Split) -> (Vec<f32>, usize) {
        let mut got = mem.to_vec();
        let cut = Gemm {
            split: Some(split),
            ..whole.clone()
        };
        for call in cut.calls() {
            cublas_gemm(&mut got, &call);
        }
        (got, cut.calls().iter().map(|c| c.m * c.n * c.k).sum())
    }

    /// `c = a · b` for `[2, m, k] x [2, k, n]`, each stored transposed where its flag says,
    /// planned for CUDA and lowered: the graph, the plan, its one GEMM and `[a, b, c]`.
    fn one_gemm(
        (m, k, n): (usize, usize, usize),
        (ta, tb): (bool, bool),
    ) -> (Graph, crate::plan::MemoryPlan, Gemm, [NodeId; 3]) {
        let mut g = Graph::new();
        let a_dims = if ta { [2, k, m] } else { [2, m, k] };
        let b_dims = if tb { [2, n, k] } else { [2, k, n] };
        let a = g.input("a", a_dims, DType::F32).unwrap();
        let b = g.parameter("b", b_dims, DType::F32, Init::Zeros).unwrap();
        let c = g.matmul_t(a, b, ta, tb).unwrap();
        g.set_output("c", c).unwrap();
        let plan = crate::plan::plan(&g, &plan_options()).unwrap();
        let p = lower(&g, &plan, Precision::F32).unwrap();
        let [DeviceOp::Gemm(gemm)] = &p.ops[..] else {
            panic!("one gemm, got {:?}", p.ops)
        };
        let gemm = gemm.clone();
        (g, plan, gemm, [a, b, c])
    }

    #[test]
    fn a_split_gemm_computes_what_the_whole_one_does_where_an_operand_has_a_zero_triangle() {
        use triangle::Triangle::{self, ZeroAbove, ZeroBelow};
        let (m, k, n) = (8, 8, 8);
        let value = |i: usize| ((i * 7 + 3) % 11) as f32 - 5.5;
        let mut cases = 0;
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for zero_in_a in [true, false] {
                for tri in [ZeroAbove, ZeroBelow] {
                    let (g, plan, whole, [a, b, c]) = one_gemm((m, k, n), (ta, tb));
                    let whole = &whole;
                    let (a_dims, b_dims) = (g.ty(a).shape.dims(), g.ty(b).shape.dims());
                    // Both operands filled, one with its stored triangle zero.
                    let mut mem = vec![f32::NAN; plan.total_bytes / 4];
                    let zero = |t: Triangle, row: usize, col: usize| match t {
                        ZeroAbove => col > row,
                        ZeroBelow => row > col,
                    };
                    for (x, dims, zeroed) in [(a, a_dims, zero_in_a), (b, b_dims, !zero_in_a)] {
                        let at = plan.location(&g, x).offset / 4;
                        for i in 0..2 * dims[1] * dims[2] {
                            let (row, col) = ((i / dims[2]) % dims[1], i % dims[2]);
                            mem[at + i] = if zeroed && zero(tri, row, col) {
                                0.0
                            } else {
                                value(i)
                            };
                        }
                    }
                    let triangles = if zero_in_a {
                        [Some(tri), None]
                    } else {
                        [None, Some(tri)]
                    };
                    let split = split_of(whole, (ta, tb), triangles, None, 4)
                        .unwrap_or_else(|| panic!("ta={ta} tb={tb} {tri:?} in a: {zero_in_a}"));
                    let lc = plan.location(&g, c);
                    let mut want = mem.clone();
                    cublas_gemm(&mut want, whole);
                    let product = |split: Split| {
                        let (got, work) = split_calls(&mem, whole, split);
                        (got[lc.offset / 4..][..lc.bytes / 4].to_vec(), work)
                    };
                    let (got, work) = product(split);
                    assert_eq!(
                        got,
                        want[lc.offset / 4..][..lc.bytes / 4],
                        "ta={ta} tb={tb} {tri:?} in a: {zero_in_a}"
                    );
                    // A quarter of the products is left out (halves at 4 of 8).
                    assert_eq!(work, m * n * k * 3 / 4);
                    // The other side of the diagonal would leave out what is not zero.
                    let Leave::Contraction { p_exceeds } = split.leave else {
                        panic!("{split:?}")
                    };
                    let wrong = Split {
                        leave: Leave::Contraction {
                            p_exceeds: !p_exceeds,
                        },
                        ..split
                    };
                    assert_ne!(product(wrong).0, want[lc.offset / 4..][..lc.bytes / 4]);
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 16);
    }

    #[test]
    fn a_split_gemm_computes_the_result_where_it_is_read_and_leaves_the_rest_as_it_was() {
        use triangle::Triangle::{ZeroAbove, ZeroBelow};
        let (m, k, n) = (8, 3, 8);
        let value = |i: usize| ((i * 7 + 3) % 11) as f32 - 5.5;
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for tri in [ZeroAbove, ZeroBelow] {
                let (g, plan, whole, [a, b, c]) = one_gemm((m, k, n), (ta, tb));
                let whole = &whole;
                let mut mem = vec![f32::NAN; plan.total_bytes / 4];
                for (x, len) in [(a, 2 * m * k), (b, 2 * k * n)] {
                    let at = plan.location(&g, x).offset / 4;
                    for i in 0..len {
                        mem[at + i] = value(i + at);
                    }
                }
                let mut want = mem.clone();
                cublas_gemm(&mut want, whole);
                let run = |split: Split| split_calls(&mem, whole, split).0;
                let split = split_of(whole, (ta, tb), [None, None], Some(tri), 4).unwrap();
                let got = run(split);
                let lc = plan.location(&g, c).offset / 4;
                let unread = |row: usize, col: usize| match tri {
                    ZeroAbove => col > row,
                    ZeroBelow => row > col,
                };
                let mut left = 0;
                for bt in 0..2 {
                    for row in 0..m {
                        for col in 0..n {
                            let at = lc + bt * m * n + row * n + col;
                            if unread(row, col) && got[at].is_nan() {
                                left += 1;
                            } else {
                                assert_eq!(
                                    got[at], want[at],
                                    "ta={ta} tb={tb} {tri:?} [{row}, {col}]"
                                );
                            }
                        }
                    }
                }
                // Half of each side's blocks off the diagonal: 4 x 4 of each 8 x 8.
                assert_eq!(left, 2 * 16, "ta={ta} tb={tb} {tri:?}");
                // The other orientation would leave out elements that are read.
                let Leave::Output { other_exceeds } = split.leave else {
                    panic!("{split:?}")
                };
                let wrong = run(Split {
                    leave: Leave::Output {
                        other_exceeds: !other_exceeds,
                    },
                    ..split
                });
                assert!((0..2 * m * n).any(|i| {
                    let (row, col) = ((i / n) % m, i % n);
                    !unread(row, col) && wrong[lc + i].is_nan()
                }));
            }
        }
    }

    #[test]
    fn a_gemm_below_the_split_size_or_without_a_triangle_is_one_call() {
        let gm = |m: usize, n: usize, k: usize| Gemm {
            node: NodeId(0),
            dtype: DType::F32,
            compute: Compute::F32,
            trans_first: false,
            trans_second: false,
            m,
            n,
            k,
            ld_first: m,
            ld_second: k,
            ld_out: m,
            stride_first: m * k,
            stride_second: k * n,
            stride_out: m * n,
            batch: 1,
            first: 0,
            second: 0,
            out: 0,
            workspace: Location {
                offset: 0,
                bytes: 0,
            },
            accumulate: false,
            split: None,
        };
        let above = Some(triangle::Triangle::ZeroAbove);
        let big = gm(1024, 1024, 1024);
        assert_eq!(
            split_of(&big, (false, false), [above, None], None, SPLIT_MIN).map(|s| s.at),
            Some(512)
        );
        assert_eq!(
            split_of(&big, (false, false), [None, None], None, SPLIT_MIN),
            None
        );
        assert_eq!(big.calls().len(), 1);
        // gpt2's head size as the contraction: nothing to leave out along it.
        let narrow = gm(1024, 1024, 64);
        assert_eq!(
            split_of(&narrow, (false, false), [above, None], None, SPLIT_MIN),
            None
        );
        // ... but the scores Q·Kᵀ, with their unread triangle, split along their rows.
        assert_eq!(
            split_of(&narrow, (false, false), [None, None], above, SPLIT_MIN).map(|s| s.leave),
            Some(Leave::Output {
                other_exceeds: true
            })
        );
        let small = gm(256, 256, 256);
        assert_eq!(
            split_of(&small, (false, false), [above, None], above, SPLIT_MIN),
            None
        );
    }

    #[test]
    fn the_gemm_compute_type_follows_the_dtype_and_the_precision() {
        use Precision::*;
        assert_eq!(Compute::of(DType::F32, F32), Some(Compute::F32));
        assert_eq!(Compute::of(DType::F32, Tf32), Some(Compute::Tf32));
        assert_eq!(Compute::of(DType::F32, Bf16), Some(Compute::F32));
        assert_eq!(Compute::of(DType::F64, Tf32), Some(Compute::F64));
        assert_eq!(Compute::of(DType::BF16, F32), Some(Compute::Bf16F32));
        assert_eq!(Compute::of(DType::I32, F32), None);
        let json = serde_json::to_string(&Compute::Bf16F32).unwrap();
        assert_eq!(json, "\"bf16_f32\"");
    }

    #[test]
    fn a_bf16_gpt_step_lowers_with_every_kernel_generated_and_bf16_gemms_accumulating_in_f32() {
        let m = crate::models::by_name(
            "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2",
        )
        .unwrap();
        let opts = pipeline::Options {
            precision: Some(Precision::Bf16),
            ..cuda()
        };
        let c = pipeline::compile(&m, &opts).unwrap();
        let p = lower(&c.graph, &c.plan, Precision::Bf16).unwrap();
        p.check(p.total_bytes).unwrap();
        let gemms: Vec<&Gemm> = p
            .ops
            .iter()
            .filter_map(|o| match o {
                DeviceOp::Gemm(g) => Some(g),
                _ => None,
            })
            .collect();
        let matmuls = c
            .graph
            .ids()
            .filter(|&id| {
                matches!(
                    c.graph.node(id).op,
                    Op::MatMul { .. } | Op::MatMulAcc { .. }
                )
            })
            .count();
        assert_eq!(gemms.len(), matmuls);
        for g in gemms {
            match c.graph.node(g.node).op {
                // A product summed into an f32 gradient: bf16 operands, f32 result, beta = 1.
                Op::MatMulAcc { .. } if g.dtype == DType::F32 => {
                    assert_eq!(g.compute, Compute::Bf16InF32Out);
                    assert!(g.accumulate);
                }
                Op::MatMulAcc { .. } => {
                    assert_eq!((g.dtype, g.compute), (DType::BF16, Compute::Bf16F32));
                    assert!(g.accumulate);
                }
                _ => {
                    assert_eq!((g.dtype, g.compute), (DType::BF16, Compute::Bf16F32));
                    assert!(!g.accumulate);
                }
            }
        }
        assert!(
            p.prelude.contains("ig_bf16_bits"),
            "the bf16 helpers are in the module"
        );
        // Fused kernels round each bf16 value where the IR types it, as the unfused ops do.
        assert!(p.kernels.iter().any(|k| k.source.contains("ig_to_bf16(")));
        assert!(p.kernels.iter().any(|k| k.source.contains("ig_round(")));
        // The f32 step of the same model keeps f32 GEMMs and the plain prelude.
        let c = pipeline::compile(&m, &cuda()).unwrap();
        let p = lower(&c.graph, &c.plan, Precision::Tf32).unwrap();
        assert_eq!(p.prelude, codegen::PRELUDE);
        assert!(p.ops.iter().all(|o| match o {
            DeviceOp::Gemm(g) => g.compute == Compute::Tf32,
            _ => true,
        }));
    }

    /// mlp's step planned and lowered for CUDA.
    fn lowered_mlp() -> Program {
        let c = pipeline::compile_model("mlp", &cuda()).unwrap();
        lower(&c.graph, &c.plan, Precision::F32).unwrap()
    }

    #[test]
    fn a_damaged_program_is_refused_naming_what_is_wrong() {
        let p = lowered_mlp();
        let total = p.total_bytes;
        p.check(total).unwrap();
        let refused = |q: &Program, says: &str| {
            let e = q.check(total).unwrap_err().to_string();
            assert!(e.contains(says), "{says:?} not in {e}");
        };
        // A launch of a kernel the program does not hold.
        let mut q = p.clone();
        if let Some(DeviceOp::Launch { kernel, .. }) = q
            .ops
            .iter_mut()
            .find(|o| matches!(o, DeviceOp::Launch { .. }))
        {
            *kernel = 999;
        }
        refused(&q, "kernel 999");
        // One kernel twice.
        let mut q = p.clone();
        q.kernels.push(q.kernels[0].clone());
        refused(&q, "appears twice");
        // A launch shape no GPU launches.
        let mut q = p.clone();
        q.kernels[0].launch.block = [2048, 1, 1];
        refused(&q, "1024 threads");
        // An operation that no longer waits for the one whose output it reads.
        let mut q = p.clone();
        let j = (0..q.deps.len()).find(|&j| !q.deps[j].is_empty()).unwrap();
        q.deps[j].clear();
        refused(&q, "does not wait");
        // Tables of different lengths, and another allocation's program.
        let mut q = p.clone();
        q.touches.pop();
        refused(&q, "touch lists");
        let e = p.check(total + 256).unwrap_err().to_string();
        assert!(e.contains("allocation of"), "{e}");
    }

    #[test]
    fn a_program_survives_its_json_form_unchanged() {
        let p = lowered_mlp();
        let json = serde_json::to_string(&p).unwrap();
        let back: Program = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn a_fused_step_lowers_to_kernels_gemms_and_nothing_else() {
        let c = pipeline::compile_model("mlp", &cuda()).unwrap();
        let p = lower(&c.graph, &c.plan, Precision::F32).unwrap();
        let counts = p.counts();
        let matmuls = c
            .graph
            .ids()
            .filter(|&id| {
                matches!(
                    c.graph.node(id).op,
                    Op::MatMul { .. } | Op::MatMulAcc { .. }
                )
            })
            .count();
        let fused = c
            .graph
            .ids()
            .filter(|&id| matches!(c.graph.node(id).op, Op::Fused(_)))
            .count();
        assert_eq!(counts.gemms, matmuls);
        assert_eq!(counts.launches, fused);
        // Each distinct kernel is generated once, and the module holds each exactly once.
        assert!(p.kernels.len() <= fused);
        let src = p.module_source();
        for k in &p.kernels {
            assert_eq!(
                src.matches(&format!(" {}(", k.name)).count(),
                1,
                "{}",
                k.name
            );
        }
    }

    #[test]
    fn a_gpt_step_is_a_dependency_graph_with_independent_operations_not_a_chain() {
        let c = pipeline::compile_model("gpt-mini", &cuda()).unwrap();
        let p = lower(&c.graph, &c.plan, Precision::F32).unwrap();
        assert_eq!(p.deps.len(), p.ops.len());
        deps::check(&p.touches, &p.deps).unwrap();
        // Operations that need not wait for the one before them: each may overlap it.
        let reach = |j: usize| {
            let mut seen = vec![false; j];
            let mut stack: Vec<usize> = p.deps[j].to_vec();
            while let Some(i) = stack.pop() {
                if !std::mem::replace(&mut seen[i], true) {
                    stack.extend_from_slice(&p.deps[i]);
                }
            }
            seen
        };
        let free = (1..p.ops.len()).filter(|&j| !reach(j)[j - 1]).count();
        // Every parameter's update is independent of the other parameters' updates at least.
        let params = c.graph.leaves(crate::ir::LeafKind::Parameter).len();
        assert!(free >= params / 2, "{free} of {} ops", p.ops.len());
    }

    #[test]
    fn a_scatter_adds_sort_of_its_ids_waits_for_no_gemm_and_only_its_sums_wait_for_the_backward_pass(
    ) {
        let c = pipeline::compile_model("gpt-mini", &cuda()).unwrap();
        let p = lower(&c.graph, &c.plan, Precision::F32).unwrap();
        let scatter = (c.graph.ids())
            .find(|&id| matches!(c.graph.node(id).op, Op::ScatterAdd { .. }))
            .unwrap();
        // The token ids are an input: the sorted ids' bytes are held from the step's start.
        let w = c.plan.liveness.workspace_of[scatter.index()].unwrap();
        assert_eq!(c.plan.liveness.storages[w].start, 0);
        let launches: Vec<usize> = (0..p.ops.len())
            .filter(|&j| matches!(p.ops[j], DeviceOp::Launch { node, .. } if node == scatter))
            .collect();
        assert!(launches.len() >= 4, "{launches:?}");
        let waits_for_a_gemm = |j: usize| {
            let mut seen = vec![false; j];
            let mut stack: Vec<usize> = p.deps[j].to_vec();
            while let Some(i) = stack.pop() {
                if !std::mem::replace(&mut seen[i], true) {
                    if matches!(p.ops[i], DeviceOp::Gemm(_)) {
                        return true;
                    }
                    stack.extend_from_slice(&p.deps[i]);
                }
            }
            false
        };
        // The sort and the runs found in it, then the short and the long runs' sums.
        let (sort, sums) = launches.split_at(launches.len() - 2);
        for &j in sort {
            assert!(!waits_for_a_gemm(j), "sort launch {j} waits for a GEMM");
        }
        for &j in sums {
            assert!(waits_for_a_gemm(j));
        }
        // In program order too: the sort is lowered before the first GEMM.
        let first_gemm = (p.ops.iter())
            .position(|o| matches!(o, DeviceOp::Gemm(_)))
            .unwrap();
        assert!(
            sort.iter().all(|&j| j < first_gemm),
            "{sort:?} {first_gemm}"
        );
    }

    #[test]
    fn a_plan_that_holds_a_scatter_adds_workspace_at_the_node_alone_gets_its_sort_there() {
        // A plan made without the CUDA target's fill rule (the bytes at the node alone) must
        // not have the sort lowered early, where those bytes hold other values.
        fn at_node(g: &Graph, id: NodeId) -> crate::plan::WorkspaceNeed {
            crate::plan::WorkspaceNeed::at_node(workspace_bytes(g, id))
        }
        let opts = pipeline::Options {
            plan: crate::plan::PlanOptions {
                workspace: Some(at_node),
                ..Default::default()
            },
            ..Default::default()
        };
        let c = pipeline::compile_model("gpt-mini", &opts).unwrap();
        let p = lower(&c.graph, &c.plan, Precision::F32).unwrap();
        let scatter = (c.graph.ids())
            .find(|&id| matches!(c.graph.node(id).op, Op::ScatterAdd { .. }))
            .unwrap();
        let launches: Vec<usize> = (0..p.ops.len())
            .filter(|&j| matches!(p.ops[j], DeviceOp::Launch { node, .. } if node == scatter))
            .collect();
        // All of them together, after the memset of the output.
        assert!(launches.len() >= 4);
        assert!(
            launches.windows(2).all(|w| w[1] == w[0] + 1),
            "{launches:?}"
        );
        assert!(matches!(p.ops[launches[0] - 1], DeviceOp::Zero { .. }));
    }

    #[test]
    fn a_gpt_step_lowers_with_every_address_inside_the_allocation() {
        let spec = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";
        let c = pipeline::compile_model(spec, &cuda()).unwrap();
        let p = lower(&c.graph, &c.plan, Precision::F32).unwrap();
        let counts = p.counts();
        assert!(counts.gemms > 0 && counts.launches > 0);
        // The embedding's gradient is a scatter-add: zeroed, then added into.
        assert!(counts.memsets >= 1, "{counts:?}");
        // check ran inside lower; check it catches a bad address too.
        let mut bad = p.clone();
        if let Some(DeviceOp::Launch { args, .. }) = bad
            .ops
            .iter_mut()
            .find(|o| matches!(o, DeviceOp::Launch { .. }))
        {
            args[0] = bad.total_bytes;
        }
        assert!(bad.check_bounds().is_err());
    }

    #[test]
    fn an_unfused_elementwise_op_is_an_error_that_says_to_fuse() {
        let c = pipeline::compile_model("mlp", &pipeline::Options::unoptimized(plan_options()))
            .unwrap();
        let e = super::super::lower(&c.graph, &c.plan, Target::Cuda, Default::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("fusion"), "{e}");
    }

    #[test]
    fn a_plan_without_cublas_workspace_is_an_error_naming_it() {
        let opts = pipeline::Options {
            plan: crate::plan::PlanOptions::default(),
            ..Default::default()
        };
        let c = pipeline::compile_model("mlp", &opts).unwrap();
        let e = super::super::lower(&c.graph, &c.plan, Target::Cuda, Default::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("matmul") && e.contains("workspace"), "{e}");
    }
}
