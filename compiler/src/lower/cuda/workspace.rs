//! The scratch each node is planned on the CUDA target: the attention kernels' shapes, and the
//! layout of a convolution's workspace (its chunk of images, column buffer and cuBLAS space).

use crate::ir::{ConvLayout, DType, Graph, NodeId, Op, WindowOp};
use crate::plan::MemoryPlan;
use crate::precision::Precision;
use ingot_kernels::cpu::conv::{ConvGeometry, Pass};
use ingot_kernels::cuda as codegen;
use ingot_kernels::cuda::attention::{self, AttentionPrecision, AttentionShape};
use ingot_kernels::cuda::window as kernels;
use smallvec::SmallVec;

/// Bytes of cuBLAS workspace planned for every matmul: what NVIDIA recommends on Hopper
/// (cuBLAS guide, `cublasSetWorkspace`). It lives in the slab only while its matmul runs.
pub const CUBLAS_WORKSPACE: usize = 32 << 20;

/// Scratch bytes each node needs on the CUDA target: a matmul's cuBLAS workspace; an NCHW
/// convolution's for one image at a time, a channels-last one's cuDNN floor
/// ([`conv_least_bytes`]) (more is granted where the peak leaves room,
/// [`workspace_need`]); a max pooling's gradient, its windows' picks
/// ([`pool_pick_workspace`]); a fused
/// kernel split in two or by stages, its partial and finished sums
/// ([`codegen::fused_scratch_bytes`]); a scatter-add,
/// its ids sorted ([`codegen::scatter_add_scratch_bytes`]); other fused kernels keep
/// their intermediates in registers and need none.
pub fn workspace_bytes(g: &Graph, id: NodeId) -> usize {
    match g.node(id).op {
        Op::MatMul { .. } | Op::MatMulAcc { .. } => CUBLAS_WORKSPACE,
        Op::Attention { .. } | Op::AttentionGrad { .. } => attention_workspace(g, id).total,
        Op::Window(_) => conv_least_bytes(g, id)
            .or_else(|| pool_pick_workspace(g, id))
            .unwrap_or(0),
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
        // A convolution runs faster a larger chunk of images at a time, and one over few
        // input channels (a stem) through cuDNN in room for its operands' padded copies.
        up_to: match g.node(id).op {
            Op::Window(ref w) => conv_workspace(g, id).map_or(0, |c| {
                let e = g.node(id).ty.dtype.size();
                let few = super::conv::cudnn_few_channel_room(&c.geometry, w.layout(), e);
                c.total.max(few)
            }),
            _ => 0,
        },
        filled_from: match g.node(id).op {
            Op::ScatterAdd { .. } => Some(0),
            _ => None,
        },
        // A channels-last convolution's cuDNN floor is lower than the im2col column the
        // other workspaces grew beside: they keep the ceiling they had.
        ceiling_bytes: match g.node(id).op {
            Op::Window(ref w) if w.layout() == ConvLayout::Nhwc => {
                conv_workspace_least(g, id).map_or(0, |c| c.total)
            }
            _ => 0,
        },
    }
}

/// Where an attention node's workspace puts what its kernels need besides its planned
/// outputs: the backward pass's `delta` ([`attention::backward_workspace_bytes`]) first, then
/// each output no result node names ([`crate::lower::unnamed_outputs`]), which the kernels write all
/// the same; each region 256-byte aligned.
pub(super) struct AttentionWorkspace {
    /// Byte offset of `delta` within the workspace (backward only).
    pub(super) delta: Option<usize>,
    /// `(output index, offset within the workspace)` of each unnamed output.
    pub(super) outputs: Vec<(usize, usize)>,
    pub(super) total: usize,
}

pub(super) fn attention_workspace(g: &Graph, id: NodeId) -> AttentionWorkspace {
    let align = |x: usize| x.div_ceil(256) * 256;
    let mut at = 0;
    let delta = match attention_shape(g, id, Precision::F32) {
        Some(s) if matches!(g.node(id).op, Op::AttentionGrad { .. }) => {
            at = align(attention::backward_workspace_bytes(&s));
            Some(0)
        }
        _ => None,
    };
    let outputs = crate::lower::outputs::unnamed_outputs(g, id)
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

/// Bytes a convolution's chunk of column buffer (with the weight gradient's rearranged `dy`)
/// may take: large enough that a chunk's GEMMs fill the GPU, small beside the activations.
pub const COLUMN_BUDGET: usize = 32 << 20;

const ALIGN: usize = 256;

fn align(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// Where a convolution's workspace puts what it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvWorkspace {
    pub geometry: ConvGeometry,
    pub pass: Pass,
    /// Images per chunk (divides the batch).
    pub samples: usize,
    /// Bytes of the column buffer, at offset 0.
    pub column_bytes: usize,
    /// Offset and bytes of `dy` side by side (the weight gradient only).
    pub side: Option<(usize, usize)>,
    /// Offset of cuBLAS's workspace ([`CUBLAS_WORKSPACE`] bytes).
    pub blas: usize,
    pub total: usize,
}

/// The workspace layout convolution node `id` runs fastest in: the largest chunk of images
/// whose column buffer fits [`COLUMN_BUDGET`] (`None` for any other node, pooling included,
/// or operands that make no convolution). The planner grants it where the step's peak leaves
/// room ([`crate::plan::WorkspaceNeed::up_to`]); [`conv_workspace_within`] says what runs in
/// what it granted.
pub fn conv_workspace(g: &Graph, id: NodeId) -> Option<ConvWorkspace> {
    let (geometry, pass, e) = conv_parts(g, id)?;
    let samples = (1..=geometry.batch.max(1))
        .rev()
        .filter(|s| geometry.batch % s == 0)
        .find(|&s| column_and_side(&geometry, pass, e, s) <= COLUMN_BUDGET)
        .unwrap_or(1);
    Some(layout(geometry, pass, e, samples))
}

/// The workspace of max-pooling gradient node `id`: a byte a window, the tap each window
/// picks ([`kernels::max_pool2d_pick`]), which the gradient then reads instead of scanning
/// every window again for each of its elements (resnet50's stem at 224, batch 128: 25.7 MB).
/// `None` for any other node, or a pooling whose windows have more than 255 taps.
pub fn pool_pick_workspace(g: &Graph, id: NodeId) -> Option<usize> {
    let node = g.node(id);
    let crate::ir::Op::Window(w @ WindowOp::MaxPool2dGrad(_)) = &node.op else {
        return None;
    };
    let p = w.pool_geometry(g.ty(node.inputs[0]).shape.dims())?;
    kernels::pool_pick_bytes(&p)
}

/// The smallest workspace convolution node `id` runs in: one image at a time.
pub fn conv_workspace_least(g: &Graph, id: NodeId) -> Option<ConvWorkspace> {
    let (geometry, pass, e) = conv_parts(g, id)?;
    Some(layout(geometry, pass, e, 1))
}

/// Bytes every channels-last convolution is planned at least, besides its filter gradient's
/// accumulator ([`cudnn_least`]).
pub const CUDNN_FLOOR: usize = 1 << 20;

/// The least workspace convolution node `id` is planned: a channels-last convolution, which
/// only cuDNN runs (the im2col kernels read NCHW images, so it has no fallback),
/// [`cudnn_least`]; an NCHW one its im2col path's one image at a time
/// ([`conv_workspace_least`]), which its fallback needs. `None` for any other node.
pub fn conv_least_bytes(g: &Graph, id: NodeId) -> Option<usize> {
    let (geometry, pass, e) = conv_parts(g, id)?;
    Some(match &g.node(id).op {
        Op::Window(w) if w.layout() == ConvLayout::Nhwc => cudnn_least(&geometry, pass),
        _ => layout(geometry, pass, e, 1).total,
    })
}

/// The workspace a cuDNN-only convolution keeps where the step's peak leaves no room for
/// more: cuDNN's deterministic algorithms need none for the forward and data-gradient passes,
/// and at most 4 bytes an element of the filter (an f32 accumulator) and 216 bytes for the
/// filter gradient, measured for each of 1,040 convolutions of eight models on an H200 with
/// cuDNN 9 (`runtime/examples/cudnn_offers.rs`; docs/benchmarks.md, session 37). Twice the
/// filter's share and [`CUDNN_FLOOR`] leave room for other GPUs and versions. Where the
/// peak leaves room the planner grants up to the im2col layout's ([`conv_workspace`]),
/// which holds the algorithm cuDNN ranks first in most convolutions.
pub fn cudnn_least(geometry: &ConvGeometry, pass: Pass) -> usize {
    let filter = match pass {
        Pass::GradWeight => {
            8 * geometry.out_ch
                * (geometry.in_ch / geometry.groups.max(1))
                * geometry.kernel[0]
                * geometry.kernel[1]
        }
        _ => 0,
    };
    align(CUDNN_FLOOR + filter)
}

/// The layout convolution node `id` runs in within `bytes` of planned workspace: the largest
/// chunk of images (a divisor of the batch, at most [`conv_workspace`]'s) whose layout fits.
/// `None` when not even one image's does, or the node is no convolution.
pub fn conv_workspace_within(g: &Graph, id: NodeId, bytes: usize) -> Option<ConvWorkspace> {
    let (geometry, pass, e) = conv_parts(g, id)?;
    let most = conv_workspace(g, id)?.samples;
    (1..=most)
        .rev()
        .filter(|s| geometry.batch % s == 0)
        .map(|s| layout(geometry, pass, e, s))
        .find(|l| l.total <= bytes)
}

/// The layout convolution node `id` runs in under `plan` (see [`conv_workspace_within`]).
pub fn planned_conv_workspace(g: &Graph, plan: &MemoryPlan, id: NodeId) -> Option<ConvWorkspace> {
    conv_workspace_within(g, id, plan.workspace(id)?.bytes)
}

/// A convolution node's geometry, pass and element size.
fn conv_parts(g: &Graph, id: NodeId) -> Option<(ConvGeometry, Pass, usize)> {
    let node = g.node(id);
    let crate::ir::Op::Window(w) = &node.op else {
        return None;
    };
    let dims: SmallVec<[&[usize]; 2]> = node.inputs.iter().map(|&x| g.ty(x).shape.dims()).collect();
    let (geometry, pass) = w.conv_geometry(&dims, node.ty.shape.dims())?;
    Some((geometry, pass, node.ty.dtype.size()))
}

/// Bytes of a chunk of `s` images' column buffer and, for the weight gradient, its `dy` side
/// by side.
fn column_and_side(geometry: &ConvGeometry, pass: Pass, e: usize, s: usize) -> usize {
    kernels::column_len(geometry, s) * e + side_bytes(geometry, pass, e, s)
}

fn side_bytes(geometry: &ConvGeometry, pass: Pass, e: usize, s: usize) -> usize {
    match pass {
        Pass::GradWeight => s * geometry.out_ch * geometry.positions() * e,
        _ => 0,
    }
}

/// The workspace of a convolution run `samples` images at a time.
fn layout(geometry: ConvGeometry, pass: Pass, e: usize, samples: usize) -> ConvWorkspace {
    let column_bytes = kernels::column_len(&geometry, samples) * e;
    let mut at = align(column_bytes);
    let side = (pass == Pass::GradWeight).then(|| {
        let o = at;
        let bytes = side_bytes(&geometry, pass, e, samples);
        at += align(bytes);
        (o, bytes)
    });
    let blas = at;
    ConvWorkspace {
        geometry,
        pass,
        samples,
        column_bytes,
        side,
        blas,
        total: blas + CUBLAS_WORKSPACE,
    }
}
