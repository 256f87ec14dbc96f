//! Recognition: attention written as plain math becomes one [`Op::Attention`].
//!
//! A model stays the plain math (`nn::causal_self_attention`, or the same written in the IR
//! text form): scores `q·kᵀ` as a matmul (k transposed by a view or by the matmul's `tb`), times a
//! scalar (or divided by one), optionally masked by `select(j > i, fill, scores)` with `i`, `j`
//! iotas along the query and key axes and `fill` a constant no softmax can tell from `-inf`,
//! then a softmax over the keys as [`crate::trace::nn::softmax`] writes it (row max, optionally
//! under `stop_gradient`, subtract, `exp`, row sum, divide), then `· v`. [`attention`] replaces
//! each such chain by one attention op reading q, k and v, so neither the scores nor the
//! probabilities `[.., Tq, Tk]` are ever stored, and autodiff then gives it the fused backward
//! ([`Op::AttentionGrad`]).
//!
//! A chain is replaced only when the replacement computes the same values:
//! - every intermediate (the scores, the scaled and masked scores, the row max and sum, the
//!   exponentials, the probabilities) is used by the chain alone: no other op, output or update
//!   reads it (a model that also returns the probabilities keeps its plain math);
//! - the softmax reduces exactly the key axis (the last), and the two reductions read the same
//!   scores;
//! - the mask is provably causal: a compare of two integer iotas (through broadcasts, which
//!   align axes on the right and so keep an iota's axis), one along the key axis and one along
//!   the query axis, sized as the scores' axes, with the compare and the select's branches
//!   oriented so that exactly the keys `j > i` take the fill (`gt(j, i)` or `lt(i, j)` choosing
//!   the fill, `le(j, i)` or `ge(i, j)` choosing the scores). A masked key's probability is then
//!   `exp(fill − max) / Σ`, exactly 0 for a fill at most `-1e30` with finite scores, as in the
//!   fused op where the key is not visible. Any other mask leaves the chain as it is.
//!
//! It runs on the traced forward graph, before the precision policy
//! (the precision module's `autocast_bf16` treats the attention op like a matmul: q, k, v and its
//! output in bf16, its log-sum-exp in f32) and before autodiff. The graph is otherwise copied
//! unchanged: the same nodes in the same order, less the chains' intermediates and what only
//! they used (the mask, the scale constant), plus a view for a q, k or v stored transposed;
//! where the attention reads the model's own tensors in a token-major layout (`layout`), the
//! views it no longer needs go too, and its output is transposed back to the chain's layout.

mod layout;
mod mask;

use crate::error::IrError;
use crate::ir::{BinaryOp, CmpOp, DType, Graph, NodeId, Op, ReduceOp, UnaryOp};
use layout::Reads;
use mask::MASK_FILL_MAX;
use std::collections::HashMap;

/// One attention chain found in the graph.
#[derive(Clone, Debug, PartialEq)]
struct Found {
    /// The final matmul `p · v`: the attention replaces its value.
    out: NodeId,
    /// q as the scores' matmul reads it, and whether it reads it transposed.
    q: (NodeId, bool),
    /// kᵀ as the scores' matmul reads it (`[.., D, Tk]` unless transposed by the flag).
    kt: (NodeId, bool),
    /// v as the final matmul reads it.
    v: (NodeId, bool),
    causal: bool,
    scale: f64,
    /// The chain's intermediates, which die with it.
    interior: Vec<NodeId>,
}

/// The shape of an attention chain found in a graph, for a target to say whether it has a
/// kernel for it ([`attention_where`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The product of the axes before the last two (batch × heads).
    pub batch_heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    pub causal: bool,
}

/// Which attention chains a target can run fused (`pipeline::Options::attention_supported`).
pub type Supported = fn(&Candidate) -> bool;

/// Every chain: the CPU kernel runs any shape.
pub fn any_shape(_: &Candidate) -> bool {
    true
}

/// `g` with every attention chain replaced by one [`Op::Attention`] (see the module docs), and
/// how many were replaced. A graph with none comes back unchanged.
pub fn attention(g: &Graph) -> Result<(Graph, usize), IrError> {
    attention_where(g, any_shape)
}

/// As [`attention`], replacing only the chains `supported` accepts (a target's kernels cover
/// some head dimensions only): the others stay plain math, which every target runs.
pub fn attention_where(g: &Graph, supported: Supported) -> Result<(Graph, usize), IrError> {
    let uses = use_counts(g);
    let found: Vec<Found> = g
        .ids()
        .filter_map(|id| find(g, &uses, id))
        .filter(|f| supported(&candidate(g, f)))
        .collect();
    if found.is_empty() {
        return Ok((g.clone(), 0));
    }
    // Each chain's operands in the layout that reads the model's own tensors (`layout`).
    let by_out: HashMap<NodeId, (&Found, Reads)> = found
        .iter()
        .map(|f| {
            let k = (f.kt.0, !f.kt.1); // the scores read kᵀ; the attention reads k
            (f.out, (f, layout::reads(g, [f.q, k, f.v])))
        })
        .collect();
    let mut removed = vec![false; g.len()];
    for f in &found {
        for &x in &f.interior {
            removed[x.index()] = true;
        }
    }
    // What the new graph keeps: leaves, what outputs and updates need (through the attention
    // ops' operands instead of the chains), and whatever the input already left unused.
    let live_before = g.live_mask();
    let mut keep = vec![false; g.len()];
    let mut stack: Vec<NodeId> = g.outputs.values().copied().collect();
    stack.extend(g.updates.iter().flat_map(|u| [u.value, u.target]));
    stack.extend(g.ids().filter(|&id| {
        (!live_before[id.index()] && !removed[id.index()]) || g.node(id).op.is_leaf()
    }));
    while let Some(id) = stack.pop() {
        if std::mem::replace(&mut keep[id.index()], true) {
            continue;
        }
        match by_out.get(&id) {
            Some((f, Reads::Heads)) => stack.extend([f.q.0, f.kt.0, f.v.0]),
            Some((_, Reads::Tokens(qkv))) => stack.extend(qkv),
            Some((_, Reads::Packed { qkv, .. })) => stack.push(*qkv),
            None => stack.extend(g.node(id).inputs.iter().copied()),
        }
    }
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; g.len()];
    for id in g.ids() {
        if !keep[id.index()] {
            continue;
        }
        // Each node keeps its origin; the attention op takes the final matmul's (its layer).
        out.set_scope(g.origin(id).clone());
        let m = |x: NodeId| map[x.index()].expect("operands of kept nodes are kept");
        let new = match by_out.get(&id) {
            Some((f, Reads::Heads)) => {
                let q = read(&mut out, m(f.q.0), f.q.1)?;
                // The scores read kᵀ; the attention reads k.
                let k = read(&mut out, m(f.kt.0), !f.kt.1)?;
                let v = read(&mut out, m(f.v.0), f.v.1)?;
                out.attention(q, k, v, f.causal, f.scale)?
            }
            Some((f, r @ Reads::Tokens(qkv))) => strided(&mut out, f, r, &qkv.map(m))?,
            Some((f, r @ Reads::Packed { qkv, dims })) => {
                let qkv = out.reshape(m(*qkv), *dims)?;
                strided(&mut out, f, r, &[qkv])?
            }
            None => {
                let n = g.node(id);
                let inputs: Vec<NodeId> = n.inputs.iter().map(|&x| m(x)).collect();
                out.push(n.op.clone(), &inputs, Some(n.ty.clone()))?
            }
        };
        map[id.index()] = Some(new);
    }
    out.keep_outputs_of(g, |x| map[x.index()].expect("outputs and updates are kept"))?;
    Ok((out, found.len()))
}

/// The attention of `f` over `operands` in a token-major layout, its `[B, T, H, D]` output
/// transposed to the chain's `[B, H, T, D]`.
fn strided(g: &mut Graph, f: &Found, r: &Reads, operands: &[NodeId]) -> Result<NodeId, IrError> {
    let o = g.attention_in(r.layout(), operands, f.causal, f.scale)?;
    g.transpose(o, &[0, 2, 1, 3])
}

/// The shape of the attention `f` computes: its output's (`[.., Tq, D]`) and the keys'.
fn candidate(g: &Graph, f: &Found) -> Candidate {
    let out = g.ty(f.out).shape.dims().to_vec();
    let r = out.len();
    let kt = g.ty(f.kt.0).shape.dims();
    // kᵀ is [.., D, Tk] as the scores read it; stored transposed it is [.., Tk, D].
    let seq_k = if f.kt.1 {
        kt[kt.len() - 2]
    } else {
        kt[kt.len() - 1]
    };
    Candidate {
        batch_heads: out[..r.saturating_sub(2)].iter().product(),
        seq_q: out[r - 2],
        seq_k,
        head_dim: out[r - 1],
        causal: f.causal,
    }
}

/// `x`, or `x` with its last two axes swapped when `transposed`.
fn read(g: &mut Graph, x: NodeId, transposed: bool) -> Result<NodeId, IrError> {
    if transposed {
        g.transpose_last(x)
    } else {
        Ok(x)
    }
}

/// How many times each value is read: operand slots, outputs and updates.
fn use_counts(g: &Graph) -> Vec<usize> {
    let mut n = vec![0; g.len()];
    for node in g.nodes() {
        for &x in &node.inputs {
            n[x.index()] += 1;
        }
    }
    for &o in g.outputs.values() {
        n[o.index()] += 1;
    }
    for u in &g.updates {
        n[u.value.index()] += 1;
        n[u.target.index()] += 1;
    }
    n
}

/// Walks from `out`, a candidate `p · v`, back through the chain; `None` at the first mismatch.
fn find(g: &Graph, uses: &[usize], out: NodeId) -> Option<Found> {
    let node = g.node(out);
    let Op::MatMul { ta: false, tb: vt } = node.op else {
        return None;
    };
    if !matches!(node.ty.dtype, DType::F32 | DType::BF16) {
        return None;
    }
    let (p, v) = (node.inputs[0], node.inputs[1]);
    let rank = g.ty(p).shape.rank();
    let key_axis = |x: NodeId, op: ReduceOp| -> bool {
        matches!(&g.node(x).op, Op::Reduce { op: o, axes } if *o == op && axes.as_slice() == [rank - 1])
    };
    let mut interior = Vec::new();
    // Every intermediate is read `n` times, all by the chain.
    let mut take = |x: NodeId, n: usize| -> Option<NodeId> {
        (uses[x.index()] == n).then(|| interior.push(x)).map(|_| x)
    };
    // p = e / broadcast(Σ e), or that with its NaNs replaced (`select(p != p, c, p)`, PyTorch's
    // SDPA export): a softmax over finite scores with a visible key in every row, which the
    // masks accepted below leave, has no NaN, so the guard changes nothing.
    take(p, 1)?;
    let p = match nan_guard(g, p) {
        Some((ne, inner)) => {
            take(ne, 1)?;
            take(inner, 3)?
        }
        None => p,
    };
    let (e, sb) = binary(g, p, BinaryOp::Div)?;
    let sum = through_broadcast(g, sb, &mut take)?;
    take(sum, 1)?;
    if !key_axis(sum, ReduceOp::Sum) || g.node(sum).inputs[0] != e {
        return None;
    }
    // e = exp(s − broadcast(stop_gradient(max s)))
    take(e, 2)?;
    if g.node(e).op != Op::Unary(UnaryOp::Exp) {
        return None;
    }
    let z = take(g.node(e).inputs[0], 1)?;
    let (s, mb) = binary(g, z, BinaryOp::Sub)?;
    let mut m = through_broadcast(g, mb, &mut take)?;
    if g.node(m).op == Op::StopGradient {
        take(m, 1)?;
        m = g.node(m).inputs[0];
    }
    take(m, 1)?;
    if !key_axis(m, ReduceOp::Max) || g.node(m).inputs[0] != s {
        return None;
    }
    take(s, 2)?;
    // s = select(causal mask, fill, scaled), scaled + a mask computed from constants (`mask`),
    // or the scaled scores themselves.
    let (scaled, causal) = if let Some(scaled) = causal_select(g, s) {
        take(scaled, 1)?;
        (scaled, true)
    } else if let Some((scaled, effect)) = added_mask(g, s) {
        take(scaled, 1)?;
        (scaled, effect == mask::Effect::Causal)
    } else {
        (s, false)
    };
    // scaled = scores · c, c · scores, scores / c, or the scores themselves.
    let (scores, scale) = match scaling(g, scaled) {
        Some((scores, scale)) => {
            take(scores, 1)?;
            (scores, scale)
        }
        None => (scaled, 1.0),
    };
    let Op::MatMul { ta: qt, tb: kt } = g.node(scores).op else {
        return None;
    };
    let (q, k) = (g.node(scores).inputs[0], g.node(scores).inputs[1]);
    // q and kᵀ each scaled before their product (PyTorch's SDPA export multiplies both by
    // √scale): the scales multiply.
    let mut scale = scale;
    let mut unscaled = |x: NodeId| -> Option<NodeId> {
        match scaling(g, x) {
            Some((inner, c)) if uses[x.index()] == 1 => {
                take(x, 1)?;
                scale *= c;
                Some(inner)
            }
            _ => Some(x),
        }
    };
    let (q, k) = (unscaled(q)?, unscaled(k)?);
    if !scale.is_finite() || g.ty(q).dtype != node.ty.dtype {
        return None;
    }
    let found = Found {
        out,
        q: (q, qt),
        kt: (k, kt),
        v: (v, vt),
        causal,
        scale,
        interior,
    };
    shapes_fit(g, &found).then_some(found)
}

/// The operands of `x` when it is the binary op `op`.
fn binary(g: &Graph, x: NodeId, op: BinaryOp) -> Option<(NodeId, NodeId)> {
    let n = g.node(x);
    (n.op == Op::Binary(op)).then(|| (n.inputs[0], n.inputs[1]))
}

/// `x`'s operand when `x` is a broadcast used once (taken into the chain), else `x`.
fn through_broadcast(
    g: &Graph,
    x: NodeId,
    take: &mut impl FnMut(NodeId, usize) -> Option<NodeId>,
) -> Option<NodeId> {
    if g.node(x).op == Op::Broadcast {
        take(x, 1)?;
        Some(g.node(x).inputs[0])
    } else {
        Some(x)
    }
}

/// The value of a constant (a `full`, possibly broadcast).
fn constant(g: &Graph, mut x: NodeId) -> Option<f64> {
    loop {
        match g.node(x).op {
            Op::Full { value } => return Some(value),
            Op::Broadcast => x = g.node(x).inputs[0],
            _ => return None,
        }
    }
}

/// `(scores, scale)` when `x` is `scores · c`, `c · scores` or `scores / c` for a constant `c`.
fn scaling(g: &Graph, x: NodeId) -> Option<(NodeId, f64)> {
    let n = g.node(x);
    match n.op {
        Op::Binary(BinaryOp::Mul) => {
            let (a, b) = (n.inputs[0], n.inputs[1]);
            match (constant(g, a), constant(g, b)) {
                (_, Some(c)) => Some((a, c)),
                (Some(c), None) => Some((b, c)),
                (None, None) => None,
            }
        }
        Op::Binary(BinaryOp::Div) => constant(g, n.inputs[1]).map(|c| (n.inputs[0], 1.0 / c)),
        _ => None,
    }
}

/// `(ne, p)` when `x` is `select(ne(p, p), c, p)` for a constant `c`: `p` with its NaNs replaced.
fn nan_guard(g: &Graph, x: NodeId) -> Option<(NodeId, NodeId)> {
    let n = g.node(x);
    if n.op != Op::Select {
        return None;
    }
    let (ne, c, p) = (n.inputs[0], n.inputs[1], n.inputs[2]);
    let cmp = g.node(ne);
    let guards = cmp.op == Op::Compare(CmpOp::Ne) && cmp.inputs[..] == [p, p];
    (guards && constant(g, c).is_some()).then_some((ne, p))
}

/// `(scaled, effect)` when `s` is `scaled + m` (or `m + scaled`) for a mask `m` computed from
/// constants that masks nothing or exactly the future keys ([`mask::additive`]).
fn added_mask(g: &Graph, s: NodeId) -> Option<(NodeId, mask::Effect)> {
    let (a, b) = binary(g, s, BinaryOp::Add)?;
    let dims = g.ty(s).shape.dims();
    [(a, b), (b, a)]
        .into_iter()
        .find_map(|(scaled, m)| mask::additive(g, m, dims).map(|e| (scaled, e)))
}

/// Which position along the scores' axes an index value stands for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Index {
    /// The query position `i` (the second-to-last axis).
    Query,
    /// The key position `j` (the last axis).
    Key,
}

/// The masked scores' operand when `s` is `select(mask, fill, scores)` (or `select(visible,
/// scores, fill)`) with a provably causal mask and a fill no softmax can tell from `-inf`.
fn causal_select(g: &Graph, s: NodeId) -> Option<NodeId> {
    let n = g.node(s);
    if n.op != Op::Select {
        return None;
    }
    let (cond, a, b) = (n.inputs[0], n.inputs[1], n.inputs[2]);
    let dims = g.ty(s).shape.dims();
    let mut c = cond;
    while g.node(c).op == Op::Broadcast {
        c = g.node(c).inputs[0];
    }
    let Op::Compare(cmp) = g.node(c).op else {
        return None;
    };
    let (x, y) = (
        index_of(g, g.node(c).inputs[0], dims)?,
        index_of(g, g.node(c).inputs[1], dims)?,
    );
    // Whether `cond` holds exactly where the key is in the future (`j > i`), or exactly where it
    // is visible (`j <= i`).
    let future = matches!(
        (cmp, x, y),
        (CmpOp::Gt, Index::Key, Index::Query) | (CmpOp::Lt, Index::Query, Index::Key)
    );
    let visible = matches!(
        (cmp, x, y),
        (CmpOp::Le, Index::Key, Index::Query) | (CmpOp::Ge, Index::Query, Index::Key)
    );
    let fills = |f: NodeId| constant(g, f).is_some_and(|v| v <= MASK_FILL_MAX);
    if future && fills(a) {
        Some(b)
    } else if visible && fills(b) {
        Some(a)
    } else {
        None
    }
}

/// What `x` (through broadcasts) indexes, when it is an integer iota along the query or key axis
/// of scores shaped `dims`, sized as that axis. Broadcasts align axes on the right and only widen
/// axes of size 1, so an iota's axis counted from the right is the scores' axis it runs along.
fn index_of(g: &Graph, mut x: NodeId, dims: &[usize]) -> Option<Index> {
    while g.node(x).op == Op::Broadcast {
        x = g.node(x).inputs[0];
    }
    let Op::Iota { axis } = g.node(x).op else {
        return None;
    };
    let t = g.ty(x);
    if !t.dtype.is_int() {
        return None;
    }
    let from_right = t.shape.rank() - axis;
    let (index, size) = match from_right {
        1 => (Index::Key, dims[dims.len() - 1]),
        2 => (Index::Query, dims[dims.len() - 2]),
        _ => return None,
    };
    (t.shape.dims()[axis] == size).then_some(index)
}

/// True when the attention op takes the chain's q, k and v (after any transposes): what the
/// op's type rule requires ([`crate::ir::attention_outputs`]), checked on a scratch graph.
fn shapes_fit(g: &Graph, f: &Found) -> bool {
    let mut s = Graph::new();
    let leaf =
        |s: &mut Graph, x: NodeId, name: &str| s.input(name, g.ty(x).shape.clone(), g.ty(x).dtype);
    (|| -> Result<NodeId, IrError> {
        let q = leaf(&mut s, f.q.0, "q")?;
        let k = leaf(&mut s, f.kt.0, "k")?;
        let v = leaf(&mut s, f.v.0, "v")?;
        let q = read(&mut s, q, f.q.1)?;
        let k = read(&mut s, k, !f.kt.1)?;
        let v = read(&mut s, v, f.v.1)?;
        s.attention(q, k, v, f.causal, f.scale)
    })()
    .is_ok_and(|o| s.ty(o).shape == g.ty(f.out).shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{AttentionLayout, Shape};
    use crate::trace::nn;

    /// x [2, 5, 8] through one causal attention layer, summed: the graph nn traces.
    fn layer(heads: usize) -> Graph {
        let mut g = Graph::new();
        let x = g.input("x", [2, 5, 8], DType::F32).unwrap();
        let y = nn::causal_self_attention(&mut g, "attn", x, heads).unwrap();
        let l = g.sum_all(y).unwrap();
        g.set_output("loss", l).unwrap();
        g
    }

    fn count(g: &Graph, f: impl Fn(&Op) -> bool) -> usize {
        g.nodes().iter().filter(|n| f(&n.op)).count()
    }

    #[test]
    fn nn_causal_self_attention_becomes_one_causal_attention_and_no_scores_remain() {
        let g = layer(2);
        let (r, n) = attention(&g).unwrap();
        assert_eq!(n, 1);
        r.verify().unwrap();
        let att: Vec<&crate::ir::Node> = r.nodes().iter().filter(|n| n.op.is_attention()).collect();
        assert_eq!(att.len(), 1);
        // q, k and v are slices of one projection: the op reads it packed, [B, T, 3, H, D],
        // and gives out token-major, [B, T, H, D].
        assert_eq!(
            att[0].op,
            Op::Attention {
                causal: true,
                scale: 1.0 / 2.0,
                layout: AttentionLayout::Packed,
            }
        );
        assert_eq!(att[0].ty.shape, Shape::new(&[2, 5, 2, 4]));
        assert_eq!(r.ty(att[0].inputs[0]).shape, Shape::new(&[2, 5, 3, 2, 4]));
        assert_eq!(count(&r, |o| matches!(o, Op::Slice { .. })), 0);
        // Nothing [.., 5, 5] (scores, mask, probabilities) is left, nor any exp or iota.
        assert!(r
            .nodes()
            .iter()
            .all(|n| !n.ty.shape.dims().ends_with(&[5, 5])));
        assert_eq!(
            count(&r, |o| matches!(o, Op::Iota { .. } | Op::Unary(_))),
            0
        );
        // The same leaves, in the same order.
        let leaves = |g: &Graph| -> Vec<String> {
            g.nodes()
                .iter()
                .filter(|n| n.op.is_leaf())
                .map(|n| format!("{:?} {}", n.op, n.ty))
                .collect()
        };
        assert_eq!(leaves(&r), leaves(&g));
    }

    /// A causal attention over `[B, T, H, D]` values `q`, `k`, `v` transposed to the heads'
    /// layout, as a model with separate projections writes it; k is read transposed by a
    /// second view when `kt` is set.
    fn separate_projections(kt: bool) -> Graph {
        let mut g = Graph::new();
        let [q, k, v] = ["q", "k", "v"].map(|n| g.input(n, [2, 5, 3, 16], DType::F32).unwrap());
        let [q, v] = [q, v].map(|x| g.transpose(x, &[0, 2, 1, 3]).unwrap());
        let s = if kt {
            let kt = g.transpose(k, &[0, 2, 3, 1]).unwrap();
            g.matmul(q, kt).unwrap()
        } else {
            let k = g.transpose(k, &[0, 2, 1, 3]).unwrap();
            g.push(
                Op::MatMul {
                    ta: false,
                    tb: true,
                },
                &[q, k],
                None,
            )
            .unwrap()
        };
        let p = nn::softmax(&mut g, s).unwrap();
        let y = g.matmul(p, v).unwrap();
        let l = g.sum_all(y).unwrap();
        g.set_output("loss", l).unwrap();
        g
    }

    #[test]
    fn transposed_token_major_operands_are_read_in_place_through_the_tokens_layout() {
        for kt in [false, true] {
            let (r, n) = attention(&separate_projections(kt)).unwrap();
            assert_eq!(n, 1);
            r.verify().unwrap();
            let att = r.nodes().iter().find(|n| n.op.is_attention()).unwrap();
            assert!(matches!(
                att.op,
                Op::Attention {
                    layout: AttentionLayout::Tokens,
                    ..
                }
            ));
            // The op reads the inputs themselves; its output is transposed back once.
            assert!(att.inputs.iter().all(|&x| r.node(x).op.is_leaf()));
            assert_eq!(count(&r, |o| matches!(o, Op::Transpose { .. })), 1);
        }
    }

    #[test]
    fn the_same_math_read_back_from_the_ir_text_is_recognized_too() {
        let g = crate::ir::text::parse(&crate::ir::text::print(&layer(1))).unwrap();
        assert_eq!(attention(&g).unwrap().1, 1);
    }

    #[test]
    fn a_graph_without_attention_comes_back_unchanged() {
        let m = crate::models::by_name("mlp").unwrap();
        let (r, n) = attention(&m.graph).unwrap();
        assert_eq!(n, 0);
        assert_eq!(r, m.graph);
    }

    /// A scores → softmax → ·v chain over q, k, v inputs, with the mask `mask` makes (`None`:
    /// no mask; its flag: the fill is the select's first branch), and the probabilities also
    /// a step output when `probs_output`.
    /// Makes a mask: the condition, and whether the fill is the select's first branch.
    type Mask = dyn Fn(&mut Graph) -> (NodeId, bool);

    fn chain(mask: Option<&Mask>, probs_output: bool) -> Graph {
        let mut g = Graph::new();
        let q = g.input("q", [3, 4, 6, 8], DType::F32).unwrap();
        let k = g.input("k", [3, 4, 7, 8], DType::F32).unwrap();
        let v = g.input("v", [3, 4, 7, 8], DType::F32).unwrap();
        let s = g.matmul_t(q, k, false, true).unwrap();
        let s = g.mul_scalar(s, 0.25).unwrap();
        let s = match mask {
            Some(f) => {
                let (c, fill_first) = f(&mut g);
                let fill = g
                    .full(f32::MIN as f64, Shape::scalar(), DType::F32)
                    .unwrap();
                if fill_first {
                    g.select(c, fill, s).unwrap()
                } else {
                    g.select(c, s, fill).unwrap()
                }
            }
            None => s,
        };
        let p = nn::softmax(&mut g, s).unwrap();
        let o = g.matmul(p, v).unwrap();
        let l = g.sum_all(o).unwrap();
        g.set_output("loss", l).unwrap();
        if probs_output {
            g.set_output("p", p).unwrap();
        }
        g
    }

    /// `compare(op, j, i)` of the row index `i` and column index `j` of `[6, 7]` (`j_first`),
    /// or `compare(op, i, j)`: how a mask spells itself from two iotas.
    fn iotas_compared(g: &mut Graph, op: CmpOp, j_first: bool) -> NodeId {
        let i = g.iota([6, 7], 0, DType::I32).unwrap();
        let j = g.iota([6, 7], 1, DType::I32).unwrap();
        let (a, b) = if j_first { (j, i) } else { (i, j) };
        g.compare(op, a, b).unwrap()
    }

    #[test]
    fn no_mask_gives_a_non_causal_attention_and_tb_reads_k_as_it_is() {
        let (r, n) = attention(&chain(None, false)).unwrap();
        assert_eq!(n, 1);
        assert_eq!(count(&r, |o| matches!(o, Op::Transpose { .. })), 0);
        assert_eq!(
            count(&r, |o| *o
                == Op::Attention {
                    causal: false,
                    scale: 0.25,
                    layout: AttentionLayout::Heads,
                }),
            1
        );
    }

    #[test]
    fn every_spelling_of_the_causal_mask_is_recognized_as_causal() {
        type Spelling = fn(&mut Graph) -> (NodeId, bool);
        let spellings: [Spelling; 4] = [
            |g| (iotas_compared(g, CmpOp::Gt, true), true),
            |g| (iotas_compared(g, CmpOp::Lt, false), true),
            |g| (iotas_compared(g, CmpOp::Le, true), false),
            |g| {
                // Broadcast iotas: i [6, 1], j [7].
                let i = g.iota([6, 1], 0, DType::I64).unwrap();
                let j = g.iota([7], 0, DType::I64).unwrap();
                (g.compare(CmpOp::Ge, i, j).unwrap(), false)
            },
        ];
        for (k, f) in spellings.iter().enumerate() {
            let (r, n) = attention(&chain(Some(f), false)).unwrap();
            assert_eq!(n, 1, "spelling {k}");
            assert_eq!(
                count(&r, |o| matches!(o, Op::Attention { causal: true, .. })),
                1,
                "spelling {k}"
            );
        }
    }

    /// PyTorch's SDPA export: q and kᵀ each scaled by √scale, `where(j > i, -inf, 0)` added to
    /// the scores (`mask`: the compare of `j` with `i` choosing the fill), and the
    /// probabilities' NaNs replaced by 0.
    fn sdpa_export(mask: Option<CmpOp>) -> Graph {
        let mut g = Graph::new();
        let q = g.input("q", [3, 4, 6, 8], DType::F32).unwrap();
        let k = g.input("k", [3, 4, 6, 8], DType::F32).unwrap();
        let v = g.input("v", [3, 4, 6, 8], DType::F32).unwrap();
        let q = g.mul_scalar(q, 0.5).unwrap();
        let kt = g.transpose_last(k).unwrap();
        let kt = g.mul_scalar(kt, 0.5).unwrap();
        let mut s = g.matmul(q, kt).unwrap();
        if let Some(cmp) = mask {
            let i = g.iota([6, 6], 0, DType::I64).unwrap();
            let j = g.iota([6, 6], 1, DType::I64).unwrap();
            let future = g.compare(cmp, j, i).unwrap();
            let fill = g.full(f64::NEG_INFINITY, [6, 6], DType::F32).unwrap();
            let zero = g.full(0.0, [6, 6], DType::F32).unwrap();
            let m = g.select(future, fill, zero).unwrap();
            let m = g.broadcast_to(m, [3, 4, 6, 6]).unwrap();
            s = g.add(s, m).unwrap();
        }
        let p = nn::softmax(&mut g, s).unwrap();
        let nan = g.compare(CmpOp::Ne, p, p).unwrap();
        let zero = g.full(0.0, [3, 4, 6, 6], DType::F32).unwrap();
        let p = g.select(nan, zero, p).unwrap();
        let o = g.matmul(p, v).unwrap();
        let l = g.sum_all(o).unwrap();
        g.set_output("loss", l).unwrap();
        g
    }

    #[test]
    fn pytorchs_sdpa_export_with_split_scales_an_added_mask_and_a_nan_guard_is_one_attention() {
        for causal in [true, false] {
            let (r, n) = attention(&sdpa_export(causal.then_some(CmpOp::Gt))).unwrap();
            assert_eq!(n, 1, "causal {causal}");
            assert_eq!(
                count(&r, |o| *o
                    == Op::Attention {
                        causal,
                        scale: 0.25,
                        layout: AttentionLayout::Heads,
                    }),
                1,
                "causal {causal}"
            );
            // Nothing of the chain is left: no exponential, no select, no iota.
            assert_eq!(count(&r, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 0);
            assert_eq!(count(&r, |o| matches!(o, Op::Select | Op::Iota { .. })), 0);
        }
    }

    #[test]
    fn an_added_mask_that_hides_the_diagonal_leaves_the_math_as_it_is() {
        for wrong in [CmpOp::Ge, CmpOp::Lt, CmpOp::Ne] {
            let g = sdpa_export(Some(wrong));
            assert_eq!(attention(&g).unwrap().1, 0, "{wrong:?}");
        }
    }

    #[test]
    fn a_mask_that_is_not_provably_causal_leaves_the_math_as_it_is() {
        type Spelling = fn(&mut Graph) -> (NodeId, bool);
        let wrong: [Spelling; 4] = [
            // j >= i: masks the diagonal too.
            |g| (iotas_compared(g, CmpOp::Ge, true), true),
            // i > j with the fill chosen: anti-causal.
            |g| (iotas_compared(g, CmpOp::Gt, false), true),
            // j > i but the scores chosen where it holds.
            |g| (iotas_compared(g, CmpOp::Gt, true), false),
            // An input mask: nothing proves it causal.
            |g| {
                let m = g.input("mask", [6, 7], DType::Bool).unwrap();
                (m, true)
            },
        ];
        for (k, f) in wrong.iter().enumerate() {
            let g = chain(Some(f), false);
            let (r, n) = attention(&g).unwrap();
            assert_eq!(n, 0, "spelling {k}");
            assert_eq!(r, g, "spelling {k}");
        }
    }

    #[test]
    fn probabilities_with_another_user_keep_the_plain_math() {
        let g = chain(None, true);
        assert_eq!(attention(&g).unwrap().1, 0);
    }

    #[test]
    fn a_softmax_over_another_axis_is_not_attention() {
        let mut g = Graph::new();
        let q = g.input("q", [4, 6, 8], DType::F32).unwrap();
        let k = g.input("k", [4, 6, 8], DType::F32).unwrap();
        let v = g.input("v", [4, 6, 8], DType::F32).unwrap();
        let s = g.matmul_t(q, k, false, true).unwrap();
        let m = g.max(s, &[1]).unwrap();
        let z = g.sub(s, m).unwrap();
        let e = g.exp(z).unwrap();
        let t = g.sum(e, &[1]).unwrap();
        let p = g.div(e, t).unwrap();
        let o = g.matmul(p, v).unwrap();
        g.set_output("o", o).unwrap();
        assert_eq!(attention(&g).unwrap().1, 0);
    }
}
