//! Lowering a planned step to the CPU backend's program: for each node in schedule order, what
//! the executor does and at which byte offsets.
//!
//! A node becomes:
//! - a fused kernel ([`Op::Fused`]): one run of the kernel's CPU implementation, with the byte
//!   offsets of its inputs, its outputs and its planned scratch;
//! - an op the plan places exactly on (some of) its operands' bytes: an in-place run, which
//!   the executor does a chunk at a time through a stack buffer so that no slice it reads
//!   overlaps one it writes (an elementwise op), or at once (a `matmul_acc` placed over its
//!   accumulator `c`, whose GEMM adds the product into those bytes);
//! - any other computing op: a run into its own bytes (matmul packs its panels into the
//!   node's planned workspace; a `matmul_acc` placed apart from `c` first copies `c` there);
//! - leaves, views and kernel results: nothing (the host writes leaves; a reshape reads its
//!   operand in place; a result is written by its kernel).
//!
//! After the last node, the updates the plan could not place in place are copied to their
//! parameters.

use super::error::LowerError;
use super::offload::{check_copies, CopyIn, CopyOut};
use super::scatter::ScatterPart;
use crate::ir::{DType, Graph, NodeId, Op};
use crate::plan::Location;
use crate::plan::MemoryPlan;
use serde::{Deserialize, Serialize};

/// What the executor does at one schedule position.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Instr {
    /// Compute node `node` into its own bytes.
    Exec { node: NodeId },
    /// Compute elementwise node `node` over the bytes of (some of) its operands, chunk by
    /// chunk; or add `matmul_acc` node `node`'s product into its accumulator's bytes, which the
    /// plan placed it on.
    InPlace { node: NodeId },
    /// Run fused kernel `node`: byte offsets of its inputs, its outputs and its scratch.
    Fused {
        node: NodeId,
        inputs: Vec<usize>,
        outputs: Vec<usize>,
        scratch: usize,
    },
    /// Data parallelism's all-reduce `node` (sum over the ranks of a gradient bucket): first
    /// the operands not placed on their outputs are copied there, then one collective replaces
    /// the `bytes` bytes at `offset` (the outputs, adjacent, and the alignment padding between
    /// them) by their sum over the ranks, as elements of `dtype`.
    AllReduce {
        node: NodeId,
        copies: Vec<Copy>,
        offset: usize,
        bytes: usize,
        dtype: DType,
        ranks: usize,
    },
    /// Data parallelism's all-gather `node`: every rank's `bytes` bytes at `from`, rank 0's
    /// first, into the `ranks * bytes` bytes at `to` (the planner keeps the two apart).
    AllGather {
        node: NodeId,
        from: usize,
        to: usize,
        bytes: usize,
        ranks: usize,
    },
    /// Data parallelism's reduce-scatter `node`: for each operand in order, one collective
    /// writes this rank's rows of the operand's sum over the ranks, as elements of `dtype`,
    /// into the output's own bytes ([`ScatterPart`]; the planner keeps every output apart from
    /// every operand).
    ReduceScatter {
        node: NodeId,
        parts: Vec<ScatterPart>,
        dtype: DType,
        ranks: usize,
    },
    /// Offload's copy in ([`crate::plan::offload`]) of a leaf's home into its staging buffer.
    CopyIn(CopyIn),
    /// Offload's copy out of a leaf's staging buffer back to its home.
    CopyOut(CopyOut),
}

impl Instr {
    /// The node the instruction computes.
    pub fn node(&self) -> NodeId {
        match self {
            Instr::Exec { node }
            | Instr::InPlace { node }
            | Instr::Fused { node, .. }
            | Instr::AllReduce { node, .. }
            | Instr::AllGather { node, .. }
            | Instr::ReduceScatter { node, .. } => *node,
            Instr::CopyIn(CopyIn { leaf, .. }) | Instr::CopyOut(CopyOut { leaf, .. }) => *leaf,
        }
    }

    /// The data-parallel ranks of a collective instruction, `None` for the others.
    pub fn ranks(&self) -> Option<usize> {
        match self {
            Instr::AllReduce { ranks, .. }
            | Instr::AllGather { ranks, .. }
            | Instr::ReduceScatter { ranks, .. } => Some(*ranks),
            _ => None,
        }
    }
}

/// A copy of `bytes` bytes from `from` to `to` at the end of the step (an update the plan could
/// not place in place).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Copy {
    pub from: usize,
    pub to: usize,
    pub bytes: usize,
}

/// The CPU backend's program of one step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Program {
    pub instrs: Vec<Instr>,
    pub copies: Vec<Copy>,
}

/// Bytes of scratch the CPU kernel of node `id` needs: a matmul's packing space, a fused
/// kernel's scratch, an attention's rows and accumulators, and for a reduction, matmul,
/// scatter-add or window op that involves bf16 the widened
/// f32 copies it computes through ([`widened`]). The planner carves them from the slab
/// ([`super::Target::plan_options`]).
pub fn workspace_bytes(g: &Graph, id: NodeId) -> usize {
    let node = g.node(id);
    match &node.op {
        // The GEMM's packing space; bf16 products run in f32 over widened copies (a
        // `matmul_acc` widens its bf16 accumulator as well, on top of the GEMM's space).
        Op::MatMul { ta, .. } => {
            let f32_kernel = gemm_workspace(g, node.inputs[0], *ta, &node.ty);
            f32_kernel.max(widened::bytes(g, id, f32_kernel))
        }
        Op::MatMulAcc { ta, .. } => {
            widened::matmul_acc_bytes(g, id) + gemm_workspace(g, node.inputs[1], *ta, &node.ty)
        }
        Op::Fused(kernel) => ingot_kernels::fused::cpu::scratch_bytes(kernel),
        Op::Attention { .. } | Op::AttentionGrad { .. } => attention_scratch_bytes(g, id),
        // A conv's column buffer and GEMM packing space (pooling needs none).
        Op::Window(w) => {
            let operands: Vec<&[usize]> =
                node.inputs.iter().map(|&x| g.ty(x).shape.dims()).collect();
            use ingot_kernels::cpu::{conv, conv_nhwc};
            let nhwc = w.layout() == crate::ir::ConvLayout::Nhwc;
            let f32_kernel = match w.conv_geometry(&operands, node.ty.shape.dims()) {
                Some((geom, pass)) => match (node.ty.dtype, nhwc) {
                    (DType::F64, false) => conv::workspace_bytes::<f64>(&geom, pass),
                    (_, false) => conv::workspace_bytes::<f32>(&geom, pass),
                    (DType::F64, true) => conv_nhwc::workspace_bytes::<f64>(&geom, pass),
                    (_, true) => conv_nhwc::workspace_bytes::<f32>(&geom, pass),
                },
                None => 0,
            };
            // bf16 window ops run in f32 over widened copies.
            f32_kernel.max(widened::bytes(g, id, f32_kernel))
        }
        _ => widened::bytes(g, id, 0),
    }
}

/// Bytes of scratch the CPU kernel of node `id` runs fastest in, when more than
/// [`workspace_bytes`] (0 otherwise): a convolution's column buffers and GEMM space for every
/// lane it can use ([`ingot_kernels::cpu::conv::workspace_len_up_to`]; with bf16, after the
/// widened copies). The planner grants them from the slab bytes free around the node
/// ([`crate::plan::room`]), never raising the plan; the kernel runs as many lanes as it gets,
/// to the same bits.
pub fn workspace_room(g: &Graph, id: NodeId) -> usize {
    let node = g.node(id);
    let Op::Window(w) = &node.op else {
        return 0;
    };
    let operands: Vec<&[usize]> = node.inputs.iter().map(|&x| g.ty(x).shape.dims()).collect();
    let Some((geom, pass)) = w.conv_geometry(&operands, node.ty.shape.dims()) else {
        return 0;
    };
    use ingot_kernels::cpu::{conv, conv_nhwc};
    let f32_kernel = match (node.ty.dtype, w.layout() == crate::ir::ConvLayout::Nhwc) {
        (DType::F64, false) => conv::workspace_bytes_up_to::<f64>(&geom, pass),
        (_, false) => conv::workspace_bytes_up_to::<f32>(&geom, pass),
        (DType::F64, true) => conv_nhwc::workspace_bytes_up_to::<f64>(&geom, pass),
        (_, true) => conv_nhwc::workspace_bytes_up_to::<f32>(&geom, pass),
    };
    f32_kernel.max(widened::bytes(g, id, f32_kernel))
}

/// Bytes of scratch the CPU attention kernel of node `id` needs
/// ([`ingot_kernels::cpu::attention`]): its f32 scratch (a row of scores, and in the backward
/// pass f32 accumulators of dk and dv for one head), then each output no result node names
/// ([`super::outputs::unnamed_outputs`]), which the kernel writes all the same; each region
/// [`widened::ALIGN`]-aligned. The runtime carves it the same way.
fn attention_scratch_bytes(g: &Graph, id: NodeId) -> usize {
    use ingot_kernels::cpu::attention as a;
    let node = g.node(id);
    let types: smallvec::SmallVec<[&crate::ir::TensorType; 6]> =
        node.inputs.iter().map(|&x| g.ty(x)).collect();
    let Ok(p) = crate::ir::attention_problem(&node.op, &types) else {
        return 0;
    };
    let s = p.cpu();
    let f32s = match node.op {
        Op::Attention { .. } => a::forward_scratch_len(&s),
        _ => a::backward_scratch_len(&s),
    };
    super::outputs::unnamed_outputs(g, id)
        .iter()
        .fold(widened::round_up(4 * f32s), |at, (_, t)| {
            at + widened::round_up(t.bytes())
        })
}

/// The scratch layout of an op the CPU runs through widened f32 copies because it involves
/// bf16 (a reduction, a matmul, a scatter-add): the f32 copies of its bf16 operands, then its
/// f32 result, each region aligned, then what the f32 kernel itself needs. The runtime's
/// executor carves the scratch by the same functions.
pub mod widened {
    use crate::ir::{DType, Graph, NodeId, Op, TensorType};

    /// Alignment of each region carved from the scratch.
    pub const ALIGN: usize = 64;

    pub fn round_up(x: usize) -> usize {
        x.div_ceil(ALIGN) * ALIGN
    }

    /// Whether the node with this op, result and operand types computes through widened f32
    /// copies.
    pub fn runs_widened(op: &Op, ty: &TensorType, inputs: &[&TensorType]) -> bool {
        matches!(
            op,
            Op::Reduce { .. }
                | Op::MatMul { .. }
                | Op::ScatterAdd { .. }
                | Op::Window(_)
                | Op::Dropout { .. }
        ) && (ty.dtype == DType::BF16 || inputs.iter().any(|t| t.dtype == DType::BF16))
    }

    /// f32 copies of the bf16 operands, then the f32 result: their bytes, each region aligned.
    pub fn regions(ty: &TensorType, inputs: &[&TensorType]) -> usize {
        let widened: usize = inputs
            .iter()
            .filter(|t| t.dtype == DType::BF16)
            .map(|t| round_up(t.shape.numel() * 4))
            .sum();
        widened + round_up(ty.shape.numel() * 4) + ALIGN
    }

    /// The scratch a `matmul_acc` that involves bf16 computes through, before its f32 GEMM's
    /// packing space: f32 copies of its bf16 operands `a` and `b`, then, for a bf16 result, the
    /// f32 sum (`c` widened, the product added, rounded once into the result); each region
    /// aligned. An f32 result is its own f32 sum: the product is added into it. 0 without bf16.
    pub fn matmul_acc_bytes(g: &Graph, id: NodeId) -> usize {
        let node = g.node(id);
        let ab: Vec<&TensorType> = node.inputs[1..].iter().map(|&x| g.ty(x)).collect();
        matmul_acc_bytes_of(&node.ty, &ab)
    }

    /// [`matmul_acc_bytes`] of a `matmul_acc` with result type `ty` and operands `a`, `b` of
    /// types `ab`.
    pub fn matmul_acc_bytes_of(ty: &TensorType, ab: &[&TensorType]) -> usize {
        if ty.dtype != DType::BF16 && ab.iter().all(|t| t.dtype != DType::BF16) {
            return 0;
        }
        let widened: usize = ab
            .iter()
            .filter(|t| t.dtype == DType::BF16)
            .map(|t| round_up(t.shape.numel() * 4))
            .sum();
        let sum = if ty.dtype == DType::BF16 {
            round_up(ty.shape.numel() * 4)
        } else {
            0
        };
        widened + sum + ALIGN
    }

    /// Bytes of scratch node `id` needs on top of what its f32 kernel needs (`f32_kernel`,
    /// the workspace of the same node computed in f32): the widened operands and the f32
    /// result. 0 for a node that involves no bf16 arithmetic.
    pub fn bytes(g: &Graph, id: NodeId, f32_kernel: usize) -> usize {
        let node = g.node(id);
        let types: Vec<&TensorType> = node.inputs.iter().map(|&x| g.ty(x)).collect();
        if !runs_widened(&node.op, &node.ty, &types) {
            return 0;
        }
        regions(&node.ty, &types) + f32_kernel
    }
}

/// The CPU GEMM's workspace for a product whose first operand is `a` (transposed when `ta`)
/// and result `ty`: f64 products pack f64, every other one f32 (bf16 runs in f32).
fn gemm_workspace(g: &Graph, a: NodeId, ta: bool, ty: &crate::ir::TensorType) -> usize {
    let a = g.ty(a).shape.dims();
    if a.len() < 2 {
        return 0;
    }
    let (r, c) = (a[a.len() - 2], a[a.len() - 1]);
    let (m, k) = if ta { (c, r) } else { (r, c) };
    let n = ty.shape.last();
    match ty.dtype {
        DType::F64 => ingot_kernels::cpu::gemm::workspace_bytes::<f64>(m, k, n),
        DType::F32 | DType::BF16 => ingot_kernels::cpu::gemm::workspace_bytes::<f32>(m, k, n),
        _ => 0,
    }
}

/// Lowers `g` under `plan` (validated by the caller, [`super::lower`]).
pub(super) fn lower(g: &Graph, plan: &MemoryPlan) -> Result<Program, LowerError> {
    let location: Vec<Location> = g.ids().map(|id| plan.location(g, id)).collect();
    let kernel_outputs = g.kernel_outputs();
    let mut instrs = Vec::with_capacity(g.len());
    for (at, &id) in plan.liveness.order.iter().enumerate() {
        for o in plan.offload.iter().filter(|o| o.copy_in_before == at) {
            let staging = location[o.leaf.index()].offset;
            instrs.push(Instr::CopyIn(CopyIn::of(o, staging)));
        }
        lower_node(g, plan, &location, &kernel_outputs, id, &mut instrs)?;
        for o in plan.offload.iter().filter(|o| o.copy_out_after == at) {
            let staging = location[o.leaf.index()].offset;
            instrs.push(Instr::CopyOut(CopyOut::of(o, staging)));
        }
    }
    let copies = plan
        .liveness
        .copies
        .iter()
        .map(|&(value, target)| {
            let (from, to) = (location[value.index()], location[target.index()]);
            Copy {
                from: from.offset,
                to: to.offset,
                bytes: from.bytes,
            }
        })
        .collect();
    let program = Program { instrs, copies };
    program.check(g, plan)?;
    Ok(program)
}

/// The instruction of node `id` (none for a leaf, a view or a kernel's result), pushed onto
/// `instrs`.
fn lower_node(
    g: &Graph,
    plan: &MemoryPlan,
    location: &[Location],
    kernel_outputs: &[smallvec::SmallVec<[NodeId; 1]>],
    id: NodeId,
    instrs: &mut Vec<Instr>,
) -> Result<(), LowerError> {
    {
        let node = g.node(id);
        if node.op.is_leaf() || node.op.is_alias() || matches!(node.op, Op::Result { .. }) {
            return Ok(());
        }
        if let Op::Fused(_) = node.op {
            instrs.push(Instr::Fused {
                node: id,
                inputs: node
                    .inputs
                    .iter()
                    .map(|x| location[x.index()].offset)
                    .collect(),
                outputs: kernel_outputs[id.index()]
                    .iter()
                    .map(|o| location[o.index()].offset)
                    .collect(),
                scratch: plan.workspace(id).map_or(0, |w| w.offset),
            });
            return Ok(());
        }
        if let Op::AllReduce { ranks } = node.op {
            let outs = &kernel_outputs[id.index()];
            let copies = node
                .inputs
                .iter()
                .zip(outs)
                .filter(|(x, o)| location[x.index()] != location[o.index()])
                .map(|(x, o)| Copy {
                    from: location[x.index()].offset,
                    to: location[o.index()].offset,
                    bytes: location[o.index()].bytes,
                })
                .collect();
            let (first, last) = (
                location[outs[0].index()],
                location[outs[outs.len() - 1].index()],
            );
            instrs.push(Instr::AllReduce {
                node: id,
                copies,
                offset: first.offset,
                bytes: last.offset + last.bytes - first.offset,
                dtype: node.ty.dtype,
                ranks,
            });
            return Ok(());
        }
        if let Op::AllGather { ranks } = node.op {
            let (from, to) = (location[node.inputs[0].index()], location[id.index()]);
            instrs.push(Instr::AllGather {
                node: id,
                from: from.offset,
                to: to.offset,
                bytes: from.bytes,
                ranks,
            });
            return Ok(());
        }
        if let Op::ReduceScatter { ranks } = node.op {
            let outs = &kernel_outputs[id.index()];
            if outs.len() != node.inputs.len() {
                return Err(LowerError::Invalid {
                    op: "reduce_scatter",
                    reason: format!(
                        "node {id} has {} operands but {} outputs named",
                        node.inputs.len(),
                        outs.len()
                    ),
                });
            }
            let parts = node
                .inputs
                .iter()
                .zip(outs)
                .map(|(x, o)| ScatterPart {
                    from: location[x.index()].offset,
                    to: location[o.index()].offset,
                    bytes: location[o.index()].bytes,
                })
                .collect();
            instrs.push(Instr::ReduceScatter {
                node: id,
                parts,
                dtype: node.ty.dtype,
                ranks,
            });
            return Ok(());
        }
        let here = location[id.index()];
        let aliased = here.bytes > 0 && node.inputs.iter().any(|x| location[x.index()] == here);
        instrs.push(if aliased {
            Instr::InPlace { node: id }
        } else {
            Instr::Exec { node: id }
        });
    }
    Ok(())
}

impl Program {
    /// What the executor's safety rests on, for a program of `g` under the validated `plan`:
    /// every instruction names a computing node of `g`; a node run into its own bytes shares
    /// none with its operands (the validated plan places an operand either exactly on its
    /// output or apart from it, and only an in-place run may take the first); every offset a
    /// fused instruction names and every copy lies inside the allocation.
    pub fn check(&self, g: &Graph, plan: &MemoryPlan) -> Result<(), LowerError> {
        let total_bytes = plan.total_bytes;
        let bad = |what: String| LowerError::Invalid {
            op: "cpu lowering",
            reason: format!("{what} falls outside the {total_bytes} bytes of the allocation"),
        };
        let invalid = |reason: String| LowerError::Invalid {
            op: "cpu lowering",
            reason,
        };
        let fits = |offset: usize, bytes: usize| {
            offset
                .checked_add(bytes)
                .is_some_and(|end| end <= total_bytes)
        };
        for i in &self.instrs {
            let id = i.node();
            if id.index() >= g.len() {
                return Err(invalid(format!(
                    "an instruction names node {id}, but the graph has {}",
                    g.len()
                )));
            }
            let node = g.node(id);
            let refuse = |why: &str| invalid(format!("node {id} ({}) {why}", node.op.name()));
            if matches!(i, Instr::CopyIn { .. } | Instr::CopyOut { .. }) {
                // Checked with the plan's offload below.
                continue;
            }
            if matches!(node.op, Op::Fused(_)) != matches!(i, Instr::Fused { .. })
                || matches!(node.op, Op::AllReduce { .. }) != matches!(i, Instr::AllReduce { .. })
                || matches!(node.op, Op::AllGather { .. }) != matches!(i, Instr::AllGather { .. })
                || matches!(node.op, Op::ReduceScatter { .. })
                    != matches!(i, Instr::ReduceScatter { .. })
            {
                return Err(refuse("has the wrong kind of instruction"));
            }
            if let Instr::AllReduce {
                copies,
                offset,
                bytes,
                ..
            } = i
            {
                if !fits(*offset, *bytes) {
                    return Err(bad(format!("the region of all-reduce {id} at {offset}")));
                }
                if let Some(c) = copies
                    .iter()
                    .find(|c| !fits(c.from, c.bytes) || !fits(c.to, c.bytes))
                {
                    return Err(bad(format!("a copy into all-reduce {id} at {}", c.to)));
                }
            }
            if let Instr::AllGather {
                from,
                to,
                bytes,
                ranks,
                ..
            } = i
            {
                let all = bytes.checked_mul(*ranks).unwrap_or(usize::MAX);
                if !fits(*from, *bytes) || !fits(*to, all) {
                    return Err(bad(format!("the bytes of all-gather {id}")));
                }
                if *from < to + all && *to < from + bytes {
                    return Err(invalid(format!(
                        "all-gather {id} is placed over its operand"
                    )));
                }
            }
            if let Instr::ReduceScatter { parts, ranks, .. } = i {
                // Each output is written while every operand may still be read (one call per
                // operand on the CPU, all at once on a device): apart from all of them.
                let sent = |p: &ScatterPart| p.bytes.saturating_mul(*ranks);
                if parts.len() != node.inputs.len() {
                    return Err(invalid(format!(
                        "reduce-scatter {id} has {} parts for {} operands",
                        parts.len(),
                        node.inputs.len()
                    )));
                }
                if let Some(p) = parts
                    .iter()
                    .find(|p| !fits(p.from, sent(p)) || !fits(p.to, p.bytes))
                {
                    return Err(bad(format!(
                        "the bytes of reduce-scatter {id} at {} -> {}",
                        p.from, p.to
                    )));
                }
                let apart = |a: usize, an: usize, b: usize, bn: usize| {
                    an == 0 || bn == 0 || a + an <= b || b + bn <= a
                };
                for (j, o) in parts.iter().enumerate() {
                    let over_operand = parts.iter().any(|x| !apart(o.to, o.bytes, x.from, sent(x)));
                    let over_output = parts[j + 1..]
                        .iter()
                        .any(|o2| !apart(o.to, o.bytes, o2.to, o2.bytes));
                    if over_operand || over_output {
                        return Err(invalid(format!(
                            "output {j} of reduce-scatter {id} is placed over {}",
                            if over_operand {
                                "an operand"
                            } else {
                                "another output"
                            }
                        )));
                    }
                }
            }
            if let (Instr::InPlace { .. }, Op::MatMulAcc { .. }) = (i, &node.op) {
                // The GEMM adds into its output: only the accumulator `c` may be under it.
                let here = plan.location(g, id);
                if plan.location(g, node.inputs[0]) != here
                    || node.inputs[1..].iter().any(|&x| {
                        let l = plan.location(g, x);
                        l.bytes > 0
                            && here.bytes > 0
                            && l.offset < here.offset + here.bytes
                            && here.offset < l.offset + l.bytes
                    })
                {
                    return Err(invalid(format!(
                        "matmul_acc {id} runs in place but its result is not exactly over \
                             its accumulator c alone"
                    )));
                }
            }
            if let Instr::Exec { .. } = i {
                let here = plan.location(g, id);
                if here.bytes > 0 && node.inputs.iter().any(|&x| plan.location(g, x) == here) {
                    return Err(refuse(
                        "is placed on an operand's bytes but is not run in place",
                    ));
                }
            }
            if let Instr::Fused {
                node,
                inputs,
                outputs,
                scratch,
            } = i
            {
                let all = inputs.iter().chain(outputs).chain(std::iter::once(scratch));
                if let Some(o) = all.copied().find(|&o| o > total_bytes) {
                    return Err(bad(format!("an address of fused node {node} at {o}")));
                }
            }
        }
        self.check_offload(plan)?;
        if let Some(c) = self
            .copies
            .iter()
            .find(|c| !fits(c.from, c.bytes) || !fits(c.to, c.bytes))
        {
            return Err(bad(format!(
                "a copy of {} bytes {} -> {}",
                c.bytes, c.from, c.to
            )));
        }
        Ok(())
    }

    /// The offload copies are exactly the plan's: one in and one out per offloaded leaf, each
    /// from or to its home in the host region and to or from a range of the allocation.
    fn check_offload(&self, plan: &MemoryPlan) -> Result<(), LowerError> {
        let bad = |reason: String| LowerError::Invalid {
            op: "cpu lowering",
            reason,
        };
        let copies = self.instrs.iter().filter_map(|i| match *i {
            Instr::CopyIn(c) => Some(c.into()),
            Instr::CopyOut(c) => Some(c.into()),
            _ => None,
        });
        check_copies(plan, copies, |_| None).map_err(bad)?;
        Ok(())
    }

    /// A short text account of the program, stable across machines (for snapshots and
    /// `ingot inspect`): instruction counts by kind, copies, and an FNV-1a-64 fingerprint of
    /// the whole program.
    pub fn summary(&self) -> String {
        let (mut exec, mut in_place, mut fused) = (0, 0, 0);
        let (mut reduces, mut gathers, mut scatters, mut offload) = (0, 0, 0, 0);
        for i in &self.instrs {
            match i {
                Instr::Exec { .. } => exec += 1,
                Instr::InPlace { .. } => in_place += 1,
                Instr::Fused { .. } => fused += 1,
                Instr::AllReduce { .. } => reduces += 1,
                Instr::AllGather { .. } => gathers += 1,
                Instr::ReduceScatter { .. } => scatters += 1,
                Instr::CopyIn { .. } | Instr::CopyOut { .. } => offload += 1,
            }
        }
        // Said only when there are some, so a one-rank program's summary is what it always was.
        let mut collective = String::new();
        if reduces > 0 {
            collective += &format!(", {reduces} all-reduces");
        }
        if gathers > 0 {
            collective += &format!(", {gathers} all-gathers");
        }
        if scatters > 0 {
            collective += &format!(", {scatters} reduce-scatters");
        }
        if offload > 0 {
            collective += &format!(", {offload} offload copies");
        }
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!(
            "{} instructions: {fused} fused kernels, {exec} ops into their own bytes, {in_place} in place{collective}\n{} copies after the last\nfingerprint: {:016x}\n",
            self.instrs.len(),
            self.copies.len(),
            crate::files::fnv1a64(&json)
        )
    }

    /// The nodes the program computes, in order.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.instrs.iter().map(Instr::node)
    }
}
