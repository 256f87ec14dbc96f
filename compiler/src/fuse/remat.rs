//! Recomputation for the backward pass: a value fusion will store (because a library call
//! reads it, as a LayerNorm output feeding a matmul, or because several kernels share it, as a
//! LayerNorm's normalized values) is read again by the backward pass. Kept, it occupies memory
//! from the forward pass to the backward one. When it is cheap to compute from values no
//! larger than itself, the backward users get their own copy of its expression instead,
//! computed just before them, and the forward value dies as soon as the forward pass is done
//! with it.

use super::kind::{kind, Kind};
use super::select::forced;
use crate::autodiff::LOSS;
use crate::error::IrError;
use crate::ir::{CmpOp, Graph, NodeId, Op};
use std::collections::HashMap;

/// Where each forward pass of a step ends: its micro-batch losses (`loss/0`, `loss/1`, ...,
/// [`crate::autodiff::accumulate`]), or its one loss; sorted. `None` for a graph without a loss.
pub(super) fn forward_ends(g: &Graph) -> Option<Vec<NodeId>> {
    let &last_loss = g.outputs.get(LOSS)?;
    let mut ends: Vec<NodeId> = g
        .outputs
        .iter()
        .filter(|(name, _)| crate::autodiff::accumulate::is_micro_batch_loss(name))
        .map(|(_, &id)| id)
        .collect();
    if ends.is_empty() {
        ends.push(last_loss);
    }
    ends.sort();
    Some(ends)
}

/// The end of the forward pass `v` belongs to (the first end at or after it).
pub(super) fn end_of(ends: &[NodeId], v: NodeId) -> Option<NodeId> {
    let k = ends.partition_point(|&e| e < v);
    ends.get(k).copied()
}

/// The nodes of the forward passes: those some loss depends on. (In node order a micro-batch's
/// backward nodes come before the next micro-batch's loss too, but no loss depends on them.)
pub(super) fn forward_nodes(g: &Graph, ends: &[NodeId]) -> Vec<bool> {
    let mut fwd = vec![false; g.len()];
    let mut stack: Vec<NodeId> = ends.to_vec();
    while let Some(x) = stack.pop() {
        if !std::mem::replace(&mut fwd[x.index()], true) {
            stack.extend(g.node(x).inputs.iter().copied());
        }
    }
    fwd
}

/// Step outputs and update values: never recomputed (their own node must be the one written).
pub(super) fn pinned(g: &Graph) -> Vec<bool> {
    let mut p = vec![false; g.len()];
    for &o in g.outputs.values() {
        p[o.index()] = true;
    }
    for u in &g.updates {
        p[u.value.index()] = true;
    }
    p
}

/// Returns the graph with forward values recomputed for their backward users, and how many
/// values were. The backward pass is what follows the loss in node order; in a step of
/// accumulated micro-batches ([`crate::autodiff::accumulate`]) each micro-batch's backward pass
/// is what follows its own loss (the outputs `loss/0`, `loss/1`, ...), and a value of one
/// micro-batch is recomputed for that micro-batch's backward pass.
pub fn recompute_for_backward(g: &Graph, recompute_ops: usize) -> Result<(Graph, usize), IrError> {
    recompute_with(g, recompute_ops, &[]).map(|(g, n, _)| (g, n))
}

/// As [`recompute_for_backward`], and besides the cheap values, the library calls `heavy`
/// (matmuls, attentions, convolutions: [`candidates`] lists them) are recomputed for the
/// backward pass too: every backward reader of such a value, directly or through values
/// fusion inlines (a bias add under a GELU's backward) or through a cheap value's copy (the
/// GELU output the next matmul's weight gradient reads), gets a copy computed just before it,
/// whose own operands are read where they are stored or are recomputed in turn (a LayerNorm
/// output under a matmul). The forward value then dies in the forward pass. Returns the graph,
/// how many values got copies, and which of `heavy` did (one whose copy would be too large an
/// expression keeps its value).
///
/// This costs the copies' arithmetic (a matmul's 2·m·n·k again) and buys memory; which values
/// are worth it is the budget fitter's choice (`compiler::fit`), not this function's.
pub fn recompute_with(
    g: &Graph,
    recompute_ops: usize,
    heavy: &[NodeId],
) -> Result<(Graph, usize, Vec<NodeId>), IrError> {
    let Some(ends) = forward_ends(g) else {
        return Ok((g.clone(), 0, Vec::new()));
    };
    let by_output = masks_by_output(g, heavy);
    let rest: Vec<NodeId> = heavy
        .iter()
        .copied()
        .filter(|m| !by_output.contains_key(m))
        .collect();
    let Copies {
        cloned_for,
        in_copy,
        count,
        is_heavy,
    } = plan_copies(g, &ends, recompute_ops, &rest)?;
    if count == 0 && by_output.is_empty() {
        return Ok((g.clone(), 0, Vec::new()));
    }
    let end_of = |v: NodeId| end_of(&ends, v);
    let mut copied: Vec<NodeId> = g
        .ids()
        .filter(|id| in_copy[id.index()] && is_heavy[id.index()])
        .filter(|&id| !matches!(g.node(id).op, Op::Result { .. }))
        .collect();
    let mut out = Graph::new();
    let mut new_id: Vec<Option<NodeId>> = vec![None; g.len()];
    let mut copy: HashMap<NodeId, NodeId> = HashMap::new();
    // Each mask recomputed from its output, made at its first backward reader.
    let mut mask_copy: HashMap<NodeId, NodeId> = HashMap::new();
    for id in g.ids() {
        let n = g.node(id);
        out.set_scope(g.origin(id).clone()); // a recomputation belongs to the node reading it
        let mut ins = Vec::with_capacity(n.inputs.len());
        for &x in &n.inputs {
            let late = end_of(x).is_some_and(|end| id > end);
            let from_output = by_output.get(&x).copied().filter(|_| late);
            ins.push(if let Some(y) = from_output {
                match mask_copy.get(&x) {
                    Some(&c) => c,
                    None => {
                        let y = match cloned_for[y.index()] {
                            true => copy_of(g, &mut out, &new_id, &in_copy, &mut copy, y)?,
                            false => new_id[y.index()].expect("operands come first"),
                        };
                        let zero =
                            new_id[g.node(x).inputs[1].index()].expect("operands come first");
                        let c =
                            out.push(g.node(x).op.clone(), &[y, zero], Some(g.ty(x).clone()))?;
                        out.set_origin(c, g.origin(x).with_suffix(" (recomputed)"));
                        mask_copy.insert(x, c);
                        copied.push(x);
                        c
                    }
                }
            } else if late && cloned_for[x.index()] {
                copy_of(g, &mut out, &new_id, &in_copy, &mut copy, x)?
            } else {
                new_id[x.index()].expect("operands come first")
            });
        }
        new_id[id.index()] = Some(out.push(n.op.clone(), &ins, Some(n.ty.clone()))?);
    }
    copied.sort();
    let count = count + mask_copy.len();
    out.keep_outputs_of(g, |x| new_id[x.index()].expect("all nodes are copied"))?;
    Ok((out, count, copied))
}

/// The masks among `heavy` that their ReLU's output gives ([`super::relu_mask`]), each with
/// that output; not when the pre-activation or the output is asked for too (a segment
/// recomputes its masks whole, from its own input).
fn masks_by_output(g: &Graph, heavy: &[NodeId]) -> HashMap<NodeId, NodeId> {
    let mut by_output = HashMap::new();
    if heavy.is_empty() {
        return by_output;
    }
    let mut asked = vec![false; g.len()];
    for &h in heavy {
        if let Some(x) = asked.get_mut(h.index()) {
            *x = true;
        }
    }
    let users = g.users();
    for &m in heavy.iter().filter(|m| m.index() < g.len()) {
        if let Some(y) = super::relu_mask::output_of(g, &users, m) {
            if !asked[g.node(m).inputs[0].index()] && !asked[y.index()] {
                by_output.insert(m, y);
            }
        }
    }
    by_output
}

/// Which forward values [`recompute_with`] gives copies to (`cloned_for`), the nodes those
/// copies recompute (`in_copy`), how many values that is, and which nodes were asked for as
/// heavy (with an attention's extra outputs).
struct Copies {
    cloned_for: Vec<bool>,
    in_copy: Vec<bool>,
    count: usize,
    is_heavy: Vec<bool>,
}

/// The decisions of [`recompute_with`] for `g` (whose forward passes end at `ends`): which
/// values get copies and what each copy recomputes; nothing is built.
fn plan_copies(
    g: &Graph,
    ends: &[NodeId],
    recompute_ops: usize,
    heavy: &[NodeId],
) -> Result<Copies, IrError> {
    let end_of = |v: NodeId| end_of(ends, v);
    let loss = *ends.last().expect("at least one");
    let mat = forced(g);
    let users = g.users();
    let pinned = pinned(g);
    // The heavy values, with the extra outputs of a heavy attention (its row statistics).
    let mut is_heavy = vec![false; g.len()];
    for &h in heavy {
        let Some(x) = is_heavy.get_mut(h.index()) else {
            return Err(IrError::Invalid(format!(
                "{h} is asked to be recomputed but the graph has {} nodes",
                g.len()
            )));
        };
        *x = true;
    }
    for id in g.ids() {
        let n = g.node(id);
        if matches!(n.op, Op::Result { .. }) && is_heavy[n.inputs[0].index()] {
            is_heavy[id.index()] = true;
        }
    }
    // Values asked for that are not library calls: the inside of a segment recomputed whole
    // ([`super::segment`]). A copy of one recomputes everything down to what it reads outside
    // the segment however many ops that is: the fitter chose it and measures it with the
    // planner.
    let in_segment: Vec<bool> = g
        .ids()
        .map(|id| is_heavy[id.index()] && kind(g.node(id)) != Kind::Library)
        .collect();
    // What fusion will store as the graph stands: the forced values and the shared values
    // that are not cheap to recompute (the residual stream under a LayerNorm, say). A copy
    // reads those rather than recomputing them, unless they get copies of their own.
    let mut stored = mat.clone();
    super::select::shared(g, &mut stored, recompute_ops);
    let kept_anyway = read_by_backward(g, ends, &stored);
    // Values fusion inlines (stores nowhere) whose expression reads a heavy value: a backward
    // kernel inlining one would read the heavy value itself.
    let forward = if heavy.is_empty() {
        Vec::new()
    } else {
        forward_nodes(g, ends)
    };
    let mut reaches_heavy = vec![false; g.len()];
    for id in g.ids() {
        let i = id.index();
        reaches_heavy[i] = is_heavy[i]
            || (!stored[i]
                && !g.node(id).op.is_leaf()
                && g.node(id).inputs.iter().any(|x| reaches_heavy[x.index()]));
    }
    // Each candidate's expression: the nodes a copy must recompute.
    let mut cloned_for: Vec<bool> = vec![false; g.len()];
    let mut in_copy: Vec<bool> = vec![false; g.len()];
    let mut count = 0;
    for v in g.ids().take(loss.index()) {
        let i = v.index();
        // A stored elementwise value, or a reshape of one (a linear layer reads its input
        // through a reshape); or a heavy value, a reshape of one, an inlined value over one,
        // or a stored value computed straight from one (the attention's q, k and v, a split
        // of the qkv product): kept, it would hold for the backward pass what recomputing
        // the heavy value was to free.
        let b = super::select::base(g, v);
        let cheap = stored[b.index()] && matches!(kind(g.node(b)), Kind::Elementwise | Kind::View);
        let over_heavy = (is_heavy[b.index()]
            || (!stored[i] && reaches_heavy[i])
            || (stored[i]
                && !g.node(v).op.is_leaf()
                && g.node(v).inputs.iter().any(|x| reaches_heavy[x.index()])))
            && forward.get(i).copied().unwrap_or(false);
        if !(cheap || over_heavy) || pinned[b.index()] || pinned[i] {
            continue;
        }
        // What a segment recomputed whole keeps: its output (the cut after it, a final
        // LayerNorm's output that the head's weight gradient reads) and the reductions inside
        // it, stored values computed from the segment but not part of it. A copy of one would
        // recompute the whole segment wherever its first backward reader is (the last block's
        // MLP for the head's backward pass, live through its peak).
        let kept_by_segment = stored[b.index()]
            && !is_heavy[b.index()]
            && !in_segment[b.index()]
            && g.node(b).inputs.iter().any(|x| in_segment[x.index()]);
        if kept_by_segment {
            continue;
        }
        let Some(end) = end_of(v) else { continue };
        let (early, late) = users[i].iter().partition::<Vec<NodeId>, _>(|u| **u <= end);
        if late.is_empty() || (early.is_empty() && !over_heavy) {
            continue;
        }
        if tested_for_equality(g, &users, &late) && over_bf16_arithmetic(g, v) {
            continue;
        }
        // A stored value cheap to recompute from the forced ones (a row statistic broadcast
        // to full size, say) is recomputed in the copy rather than kept for it; a heavy value
        // is recomputed, never read.
        let read = |y: NodeId| {
            stored[y.index()]
                && !cloned_for[y.index()]
                && !is_heavy[y.index()]
                && (mat[y.index()] || !super::select::cheap_to_recompute(g, &mat, y, recompute_ops))
        };
        let heavy = |y: NodeId| is_heavy[y.index()];
        // Only a mask's copy reads what the backward pass keeps anyway for free: a copy a
        // library call reads (a LayerNorm output under a matmul) is a buffer of its own in
        // the backward pass, and a wider one may reach values the backward pass reads only
        // through what gets copies itself.
        let mask = g.ty(v).dtype == crate::ir::DType::Bool;
        let free = |y: NodeId| mask && kept_anyway[y.index()];
        let limit = if in_segment[b.index()] || in_segment[i] {
            usize::MAX / 16
        } else {
            2 * recompute_ops
        };
        if let Some(expr) = expression(g, read, v, limit, heavy, free) {
            // A copy that would alone keep as many bytes alive to the backward pass as it frees
            // (a bias add over a product nothing else reads later) only adds a kernel.
            if !over_heavy && kept_only_for(g, &users, &expr) >= g.ty(v).bytes() {
                continue;
            }
            cloned_for[i] = true;
            for x in expr {
                in_copy[x.index()] = true;
            }
            count += 1;
        }
    }
    Ok(Copies {
        cloned_for,
        in_copy,
        count,
        is_heavy,
    })
}

/// Whether a backward reader in `late` tests the value for equality (directly or through a
/// conversion): `reduce_max`'s gradient counts the elements equal to the max (`x == max`), a
/// max the forward pass took over the original `x`.
fn tested_for_equality(g: &Graph, users: &crate::ir::Users, late: &[NodeId]) -> bool {
    let eq = |u: NodeId| matches!(g.node(u).op, Op::Compare(CmpOp::Eq | CmpOp::Ne));
    late.iter().any(|&u| {
        eq(u) || (matches!(g.node(u).op, Op::Convert) && users[u.index()].iter().any(|&w| eq(w)))
    })
}

/// Whether `v` is computed from bf16 arithmetic that fusion compiles: `v` or a value it is
/// computed from, down to the leaves and library calls, a bf16 elementwise op or reduction.
///
/// A copy of such a value need not equal the original bit for bit: a kernel computes bf16
/// arithmetic in f32 and rounds where it stores ([`super::widen`]), and a copy's kernels store
/// in other places than the original's (the copy of one value also reads the copies other
/// values made of its operands). Tested for equality with a value computed from the original
/// (the max of a `reduce_max`, in its gradient), an element equal to it in the forward pass
/// can differ in the copy: the gradient's count of maxima was 0 and the step NaN (random bf16
/// steps 1075796, 1261538, 1742846 and seven more of a million; the op-by-op reference
/// finite). Such a value is kept or inlined from the original nodes, never copied.
fn over_bf16_arithmetic(g: &Graph, v: NodeId) -> bool {
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        if !seen.insert(x) {
            continue;
        }
        match kind(g.node(x)) {
            Kind::Elementwise | Kind::Reduce if g.ty(x).dtype == crate::ir::DType::BF16 => {
                return true
            }
            Kind::Elementwise | Kind::Reduce | Kind::View | Kind::Alias => {
                stack.extend(g.node(x).inputs.iter().copied())
            }
            _ => {}
        }
    }
    false
}

/// The stored values the backward passes read whatever is recomputed: those a backward node
/// reads itself, or through values fusion inlines into it (a batch norm's backward reads the
/// convolution output under its normalized values). A copy that reads one keeps nothing alive
/// that is not kept anyway, so [`expression`]'s size rule does not count it for a mask: a
/// ReLU's or a sigmoid's mask (a bool per element, read again by its backward) is then
/// recomputed from the convolution output and the row statistics rather than kept from the
/// forward pass (efficientnet_b0 at batch 32 in bf16: 369 MiB of masks).
/// A walk stops at every stored value, so a value read only through another stored one (which
/// may itself get a copy) does not count as read.
pub(super) fn read_by_backward(g: &Graph, ends: &[NodeId], stored: &[bool]) -> Vec<bool> {
    let mut read = vec![false; g.len()];
    let mut walked = vec![false; g.len()];
    for u in g.ids() {
        for &x in &g.node(u).inputs {
            if end_of(ends, x).is_none_or(|end| u <= end) {
                continue;
            }
            let mut stack = vec![x];
            while let Some(y) = stack.pop() {
                if std::mem::replace(&mut walked[y.index()], true) {
                    continue;
                }
                let n = g.node(y);
                if stored[y.index()] {
                    read[y.index()] = true;
                } else if !n.op.is_leaf() {
                    stack.extend(n.inputs.iter().copied());
                }
            }
        }
    }
    read
}

/// Bytes of the library outputs (matrix products, say) the copy `expr` reads that nothing but
/// the copied expression reads: with the copy, such an output lives on to the backward pass in
/// place of the value, so the copy frees nothing for them (a bias add over a product that only
/// the bias add reads). Other reads are counted as free: they are either kept for the backward
/// pass anyway or recomputed in turn, which the size rule of [`expression`] already bounds.
fn kept_only_for(g: &Graph, users: &crate::ir::Users, expr: &[NodeId]) -> usize {
    let mut bases: Vec<NodeId> = Vec::new();
    for &x in expr {
        for &y in &g.node(x).inputs {
            let b = super::select::base(g, y);
            if !expr.contains(&y) && !bases.contains(&b) {
                bases.push(b);
            }
        }
    }
    bases
        .iter()
        .filter(|&&b| kind(g.node(b)) == Kind::Library && read_only_by(g, users, b, expr))
        .map(|&b| g.ty(b).bytes())
        .sum()
}

/// Whether `b` reaches nothing but the copied value `expr[0]` through the expression: every
/// reader of `b`, of a reshape of it, or of a node of the expression over it is in the
/// expression (or is that value). A node of the expression another node reads (a GELU's input,
/// which its backward pass reads too) keeps `b` alive for that reader anyway.
fn read_only_by(g: &Graph, users: &crate::ir::Users, b: NodeId, expr: &[NodeId]) -> bool {
    let mut stack = vec![b];
    let mut seen = vec![b];
    while let Some(x) = stack.pop() {
        if x == expr[0] {
            continue;
        }
        for &u in &users[x.index()] {
            if !(expr.contains(&u) || g.node(u).op.is_alias()) {
                return false;
            }
            if !seen.contains(&u) {
                seen.push(u);
                stack.push(u);
            }
        }
    }
    true
}

/// A forward value fusion stores and the backward pass reads that is not cheap to recompute:
/// a matmul, fused attention or convolution output. The budget fitter (`compiler::fit`) picks
/// which of them [`recompute_with`] recomputes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub node: NodeId,
    /// What it keeps from its forward pass to its backward one: its bytes, with an attention's
    /// row statistics.
    pub bytes: usize,
    /// The arithmetic of computing it once more ([`crate::flops::of_node`]).
    pub flops: u64,
}

/// The ReLU masks fusion keeps for the backward pass that the ReLU's output gives instead
/// ([`super::relu_mask`]): masks fusion stores and a backward node reads, which its own
/// recomputation does not recompute, whose ReLU output is stored and read by the backward
/// pass anyway (a ResNet block's output, which the next block's convolution weight gradient
/// reads), in node order. [`recompute_with`] asked for one makes `m = (y <= 0)` in the
/// backward kernel that reads the mask: one comparison an element and a read of `y` there in
/// place of the mask's, where a convolution output costs its whole product again, so the
/// price ([`Candidate::flops`]: one operation an element, one byte) puts them before any
/// library call.
pub fn mask_candidates(g: &Graph, recompute_ops: usize) -> Vec<Candidate> {
    let Some(ends) = forward_ends(g) else {
        return Vec::new();
    };
    let loss = *ends.last().expect("at least one");
    let Ok(auto) = plan_copies(g, &ends, recompute_ops, &[]) else {
        return Vec::new();
    };
    let forward = forward_nodes(g, &ends);
    let pinned = pinned(g);
    let mut stored = forced(g);
    super::select::shared(g, &mut stored, recompute_ops);
    let read_late = read_by_backward(g, &ends, &stored);
    let users = g.users();
    let kept = |v: NodeId| {
        let i = v.index();
        stored[i] && read_late[i] && forward[i] && !pinned[i] && !auto.cloned_for[i]
    };
    g.ids()
        .take(loss.index())
        .filter(|&m| kept(m))
        .filter_map(|m| {
            let y = super::relu_mask::output_of(g, &users, m)?;
            kept(y).then(|| Candidate {
                node: m,
                bytes: g.ty(m).bytes(),
                flops: crate::flops::of_node(g, m),
            })
        })
        .collect()
}

/// Whether `op` is a library call [`candidates`] may offer for recomputation.
fn heavy_kind(op: &Op) -> bool {
    matches!(
        op,
        Op::MatMul { .. }
            | Op::Attention { .. }
            | Op::Window(crate::ir::window::WindowOp::Conv2d(_))
    )
}

/// The matmul, attention and convolution outputs of the forward passes that the backward
/// passes read (directly, or through values fusion inlines or that [`recompute_for_backward`]
/// recomputes), in node order; the last library call of each forward pass aside. `g` is the graph fusion recomputes in
/// ([`super::prepared`]).
pub fn candidates(g: &Graph, recompute_ops: usize) -> Vec<Candidate> {
    let Some(ends) = forward_ends(g) else {
        return Vec::new();
    };
    let loss = *ends.last().expect("at least one");
    let pinned = pinned(g);
    let forward = forward_nodes(g, &ends);
    let mut stored = forced(g);
    super::select::shared(g, &mut stored, recompute_ops);
    // Library values a backward node reads: walk down from each forward operand of a backward
    // node through what a backward kernel would inline or recompute, to the library calls.
    let mut read_late = vec![false; g.len()];
    let mut walked = vec![false; g.len()];
    for u in g.ids() {
        for &x in &g.node(u).inputs {
            if end_of(&ends, x).is_none_or(|end| u <= end) {
                continue;
            }
            let mut stack = vec![x];
            while let Some(y) = stack.pop() {
                if std::mem::replace(&mut walked[y.index()], true) {
                    continue;
                }
                let n = g.node(y);
                match kind(n) {
                    Kind::Leaf => {}
                    Kind::Library => {
                        read_late[y.index()] = true;
                        if matches!(n.op, Op::Result { .. }) {
                            read_late[n.inputs[0].index()] = true;
                        }
                    }
                    Kind::Reduce if stored[y.index()] => {}
                    _ => stack.extend(n.inputs.iter().copied()),
                }
            }
        }
    }
    g.ids()
        .take(loss.index())
        .filter(|&v| {
            let i = v.index();
            heavy_kind(&g.node(v).op) && read_late[i] && forward[i] && !pinned[i]
        })
        // The last library call of a forward pass (a GPT's logits) is read there up to the
        // loss, where its backward readers start: a copy would only be a second one.
        .filter(|&v| {
            let end = end_of(&ends, v).unwrap_or(loss);
            (v.index() + 1..end.index())
                .any(|u| forward[u] && kind(g.node(NodeId(u as u32))) == Kind::Library)
        })
        .map(|v| {
            let results: usize = g
                .ids()
                .skip(v.index() + 1)
                .take(4)
                .filter(|&r| matches!(g.node(r).op, Op::Result { .. }) && g.node(r).inputs[0] == v)
                .map(|r| g.ty(r).bytes())
                .sum();
            Candidate {
                node: v,
                bytes: g.ty(v).bytes() + results,
                flops: crate::flops::of_node(g, v),
            }
        })
        .collect()
}

/// The nodes `v`'s copy recomputes (itself and the unstored values below it), if there are at
/// most `limit` elementwise ops among them and the stored values they read, parameters and
/// inputs aside, are no larger than `v` (within an eighth).
///
/// A copy never redoes a reduction: it reads the row the forward pass stored, so a softmax or
/// LayerNorm output is recomputed elementwise from its input and its statistics.
///
/// A heavy value (`heavy`) in the expression is recomputed, library call and all, and then the
/// size rule does not apply: the values such a copy reads (an attention's q, k and v) are
/// usually kept for the backward pass anyway, and the budget fitter measures what the copy
/// saves with the planner rather than guessing it here.
fn expression(
    g: &Graph,
    stored: impl Fn(NodeId) -> bool,
    v: NodeId,
    limit: usize,
    heavy: impl Fn(NodeId) -> bool,
    kept_anyway: impl Fn(NodeId) -> bool,
) -> Option<Vec<NodeId>> {
    // The alias chain from v down to its stored base belongs to the copy.
    let mut chain = vec![v];
    while g.node(*chain.last().expect("nonempty")).op.is_alias() {
        chain.push(g.node(*chain.last().expect("nonempty")).inputs[0]);
    }
    let mut expr = vec![v];
    let mut stack = vec![v];
    let mut read: Vec<NodeId> = Vec::new();
    let mut ops = 1;
    // The nodes of the expression that are not heavy: what the limit bounds.
    let mut light = 1;
    // Membership, for the expressions of whole segments (hundreds of nodes).
    let mut in_expr: std::collections::HashSet<NodeId> = [v].into_iter().collect();
    let mut in_read: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
    while let Some(x) = stack.pop() {
        for &y in &g.node(x).inputs {
            if in_expr.contains(&y) || in_read.contains(&y) {
                continue;
            }
            let k = kind(g.node(y));
            if heavy(y) {
                in_expr.insert(y);
                expr.push(y);
                stack.push(y);
                continue;
            }
            // A reduction's row is read where the forward pass stored it (fusion stores a
            // reduction that several kernels read), not folded again.
            if k == Kind::Leaf
                || k == Kind::Reduce
                || (stored(y) && k != Kind::Source && !chain.contains(&y))
            {
                in_read.insert(y);
                read.push(y);
                continue;
            }
            if k == Kind::Elementwise {
                ops += 1;
            }
            if ops > limit || light > 8 * limit {
                return None;
            }
            light += 1;
            in_expr.insert(y);
            expr.push(y);
            stack.push(y);
        }
    }
    if expr.iter().any(|&x| heavy(x)) {
        return Some(expr);
    }
    let own = g.ty(v).bytes();
    let stored: Vec<NodeId> = read
        .into_iter()
        .filter(|&y| !g.node(y).op.is_leaf() && !kept_anyway(y))
        .collect();
    let read_bytes: usize = stored.iter().map(|&y| g.ty(y).bytes()).sum();
    (read_bytes <= own + own / 8).then_some(expr)
}

/// The node standing for `x` in the backward pass: its copy if it belongs to one (made now, with
/// the parts of the copy below it, operands first), else the original. Depth-first with an
/// explicit stack, in the order a recursion over operands would take.
fn copy_of(
    g: &Graph,
    out: &mut Graph,
    new_id: &[Option<NodeId>],
    in_copy: &[bool],
    copy: &mut HashMap<NodeId, NodeId>,
    x: NodeId,
) -> Result<NodeId, IrError> {
    // (node, operands already copied)
    let mut stack = vec![(x, false)];
    while let Some((y, ready)) = stack.pop() {
        if !in_copy[y.index()] || copy.contains_key(&y) {
            continue;
        }
        let n = g.node(y);
        if !ready {
            stack.push((y, true));
            stack.extend(n.inputs.iter().rev().map(|&z| (z, false)));
            continue;
        }
        let ins: Vec<NodeId> = n
            .inputs
            .iter()
            .map(|&z| match copy.get(&z) {
                Some(&c) => c,
                None => new_id[z.index()].expect("operands come first"),
            })
            .collect();
        let c = out.push(n.op.clone(), &ins, Some(n.ty.clone()))?;
        out.set_origin(c, g.origin(y).with_suffix(" (recomputed)"));
        copy.insert(y, c);
    }
    Ok(match copy.get(&x) {
        Some(&c) => c,
        None => new_id[x.index()].expect("operands come first"),
    })
}

#[cfg(test)]
mod tests {
    use crate::models::compile_model;
    use crate::pipeline::Options;
    use crate::precision::Precision;

    /// The LayerNorms of a small GPT keep nothing of their own, full size, from the forward
    /// pass to the backward one (one exception, named below): their backward recomputes the normalized values from the
    /// residual stream (which the previous layer stores anyway) and the row statistics.
    #[test]
    fn a_layer_norm_keeps_only_its_row_statistics_for_the_backward_pass() {
        for precision in [Precision::F32, Precision::Bf16] {
            let opts = Options {
                precision: Some(precision),
                ..Options::for_target(crate::lower::Target::Cpu)
            };
            let c = compile_model(
                "gpt:vocab=32,d_model=16,layers=2,heads=2,d_ff=32,seq=8,batch=2",
                &opts,
            )
            .unwrap();
            let g = &c.graph;
            let lv = &c.plan.liveness;
            let loss = lv.position[g.outputs["loss"].index()];
            let full = 2 * 8 * 16;
            let kept: Vec<String> = lv
                .storages
                .iter()
                .filter(|s| !s.workspace && s.start <= loss && s.end > loss + 1)
                .map(|s| {
                    // A kernel's first origin is its own (it lists the others it fused).
                    let label = g.origin(s.owner).label();
                    let own = label.split(", ").next().unwrap_or_default().to_string();
                    (own, g.ty(s.owner).shape.numel())
                })
                // Known exception, bf16 only: the first block's ln1, computed in one kernel
                // with the embedding sum under it, still keeps its normalized values.
                .filter(|(o, _)| !(precision == Precision::Bf16 && o == "blocks.0.ln1"))
                .filter(|(o, n)| (o.contains(".ln1") || o.contains(".ln2")) && *n >= full)
                .map(|(o, n)| format!("{o} ({n} elements)"))
                .collect();
            assert!(
                kept.is_empty(),
                "{precision:?}: LayerNorm values kept for the backward pass: {kept:?}"
            );
            // And it does recompute them there.
            assert!(g
                .ids()
                .any(|id| g.origin(id).label().contains(".ln1 (recomputed)")));
        }
    }

    /// A ReLU's mask (a bool per element) under a batch norm is not kept from the forward
    /// pass to the backward one: its backward recomputes it from the convolution output and
    /// the batch norm's row statistics, which the batch norm's backward reads anyway. In a
    /// small resnet18 that is the stem's mask and the first mask of each block of layers 1
    /// and 2 (before, all 17 were kept); the mask after a residual add is still kept, and so
    /// are the masks of layers 3 and 4 where they are smaller than the statistics (2×2 images).
    #[test]
    fn a_relu_mask_is_recomputed_from_what_the_batch_norm_backward_keeps() {
        for precision in [Precision::F32, Precision::Bf16] {
            let opts = Options {
                precision: Some(precision),
                ..Options::for_target(crate::lower::Target::Cpu)
            };
            let c =
                compile_model("resnet:depth=18,side=32,batch=2,classes=5,width=8", &opts).unwrap();
            let g = &c.graph;
            let lv = &c.plan.liveness;
            let loss = lv.position[g.outputs["loss"].index()];
            let kept: Vec<String> = lv
                .storages
                .iter()
                .filter(|s| !s.workspace && s.start <= loss && s.end > loss + 1)
                .filter(|s| g.ty(s.owner).dtype == crate::ir::DType::Bool)
                .map(|s| g.origin(s.owner).primary().unwrap_or_default().to_string())
                .collect();
            let count = |name: &str| kept.iter().filter(|k| k.as_str() == name).count();
            assert_eq!(
                count("relu"),
                0,
                "{precision:?}: the stem's mask is kept: {kept:?}"
            );
            for block in ["layer1.0", "layer1.1", "layer2.0", "layer2.1"] {
                assert!(
                    count(&format!("{block}.relu")) <= 1,
                    "{precision:?}: both of {block}'s masks are kept: {kept:?}"
                );
            }
            assert!(kept.len() <= 12, "{precision:?}: {kept:?}");
        }
    }

    /// `reduce_max`'s gradient tests the values the max was taken over for equality with it:
    /// in a bf16 step those values are not recomputed for it (a copy's roundings differ from
    /// the original's), so the gradient compares the max with the very values it was taken
    /// over. Random bf16 steps 1742846 and 1354322 (three micro-batches and one), whose copies
    /// matched no element (a count of maxima of 0, NaN parameters).
    #[test]
    fn a_bf16_max_gradient_compares_the_max_with_the_values_it_was_taken_over() {
        use crate::ir::{Graph, NodeId, Op, ReduceOp};
        let through_views = |g: &Graph, mut x: NodeId| {
            while matches!(g.node(x).op, Op::Broadcast | Op::Reshape) {
                x = g.node(x).inputs[0];
            }
            x
        };
        for seed in [1742846, 1354322] {
            let m = crate::random_graph::model(seed).unwrap();
            assert_eq!(m.precision, Precision::Bf16, "seed {seed}");
            let opts = Options::for_target(crate::lower::Target::Cpu);
            let r = crate::pipeline::rewritten(&m, &crate::random_graph::step_options(seed), &opts)
                .unwrap();
            let p = crate::fuse::prepared(&r.graph).unwrap();
            let ops = crate::fuse::FuseOptions::default().recompute_ops;
            let (g, copies) = super::recompute_for_backward(&p, ops).unwrap();
            assert!(copies > 0, "seed {seed}: the step recomputes other values");
            let mut maxima = 0;
            for u in g.ids() {
                let n = g.node(u);
                if !matches!(n.op, Op::Compare(crate::ir::CmpOp::Eq)) {
                    continue;
                }
                let (x, max) = (n.inputs[0], through_views(&g, n.inputs[1]));
                if let Op::Reduce {
                    op: ReduceOp::Max, ..
                } = g.node(max).op
                {
                    maxima += 1;
                    let over = g.node(max).inputs[0];
                    assert_eq!(
                        x, over,
                        "seed {seed}: {u} compares {x} with the max over {over}"
                    );
                }
            }
            assert!(maxima > 0, "seed {seed}: no max gradient found");
        }
    }

    /// The q/k/v an attention saves is the projection plus its bias, read packed. A copy of the
    /// bias add would keep the product (which nothing else reads) alive in its place: the same
    /// bytes and one more kernel, so it is kept, not recomputed.
    #[test]
    fn a_bias_add_over_a_product_only_it_reads_is_kept_not_recomputed() {
        for precision in [Precision::F32, Precision::Bf16] {
            let opts = Options {
                precision: Some(precision),
                ..Options::for_target(crate::lower::Target::Cpu)
            };
            let c = compile_model(
                "gpt:vocab=32,d_model=64,layers=2,heads=2,d_ff=64,seq=8,batch=2",
                &opts,
            )
            .unwrap();
            let g = &c.graph;
            // The projection's values (2·8 tokens × 3·64); the LayerNorm output under the
            // projection is recomputed, and carries the projection's name too.
            let recomputed: Vec<String> = g
                .ids()
                .filter(|&id| g.ty(id).shape.numel() == 2 * 8 * 3 * 64)
                .map(|id| g.origin(id).label())
                .filter(|l| l.contains(".qkv") && l.contains("(recomputed)"))
                .collect();
            assert!(recomputed.is_empty(), "{precision:?}: {recomputed:?}");
            assert!(g
                .ids()
                .any(|id| g.origin(id).label().contains("(recomputed)")));
        }
    }
}
