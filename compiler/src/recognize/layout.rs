//! Which layout a recognized attention reads its operands in ([`AttentionLayout`]).
//!
//! A model writes attention in the heads' layout: q, k and v are sliced out of one projection
//! `[B, T, 3·C]`, reshaped to `[B, T, H, D]` and transposed to `[B, H, T, D]`, and the output is
//! transposed back. Each of those views is a copy through memory once fusion makes it a kernel
//! (and so is the join of the three gradients on the way back). The attention kernels can read
//! and write strided rows instead, so the op takes the model's own tensors:
//! - [`AttentionLayout::Packed`] when q, k and v are the three equal slices, in order, of one
//!   `[B, T, 3·H·D]` value along its last axis: the op reads that value as `[B, T, 3, H, D]`
//!   and its gradient is one tensor of that shape;
//! - [`AttentionLayout::Tokens`] when q, k and v are each a `[B, T, H, D]` value read through
//!   transposes that together swap axes 1 and 2;
//! - otherwise [`AttentionLayout::Heads`], as the chain was written.
//!
//! The two strided layouts give `out` as `[B, T, H, D]`; recognition transposes it to the
//! heads' layout the chain had, and the rewriter cancels that against the model's transpose
//! back.

use crate::ir::{AttentionLayout, Graph, NodeId, Op};

/// The operands an attention reads, by layout (ids of the graph recognition reads).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Reads {
    /// As the chain read them (with a transposing view where stored transposed).
    Heads,
    /// q, k and v, each `[B, T, H, D]`.
    Tokens([NodeId; 3]),
    /// One `[B, T, 3·H·D]` value, read as `[B, T, 3, H, D]` (the dims).
    Packed { qkv: NodeId, dims: [usize; 5] },
}

impl Reads {
    pub(super) fn layout(&self) -> AttentionLayout {
        match self {
            Reads::Heads => AttentionLayout::Heads,
            Reads::Tokens(_) => AttentionLayout::Tokens,
            Reads::Packed { .. } => AttentionLayout::Packed,
        }
    }
}

/// The layout of an attention whose q, k and v are `views[i]` read with its last two axes
/// swapped where `views[i].1` (as the chain reads them, in the heads' layout `[.., T, D]`).
pub(super) fn reads(g: &Graph, views: [(NodeId, bool); 3]) -> Reads {
    let Some(tokens) = views
        .iter()
        .map(|&(x, swap)| token_major(g, x, swap))
        .collect::<Option<Vec<NodeId>>>()
    else {
        return Reads::Heads;
    };
    let tokens = [tokens[0], tokens[1], tokens[2]];
    match packed(g, tokens) {
        Some((qkv, dims)) => Reads::Packed { qkv, dims },
        None => Reads::Tokens(tokens),
    }
}

/// The `[B, T, H, D]` value `x` is a view of when `x` (its last two axes swapped where `swap`)
/// is that value with axes 1 and 2 swapped, through any chain of transposes.
fn token_major(g: &Graph, x: NodeId, swap: bool) -> Option<NodeId> {
    if g.ty(x).shape.rank() != 4 {
        return None;
    }
    // The view so far: its axis i is axis perm[i] of `at`.
    let mut perm = if swap { [0, 1, 3, 2] } else { [0, 1, 2, 3] };
    let mut at = x;
    while let Op::Transpose { perm: p } = &g.node(at).op {
        perm = perm.map(|i| p[i]);
        at = g.node(at).inputs[0];
    }
    (perm == [0, 2, 1, 3]).then_some(at)
}

/// The `[B, T, 3·C]` value whose last axis q, k and v (`[B, T, H, D]` each, `C = H·D`) are
/// reshaped slices of, in order, with the `[B, T, 3, H, D]` it is read as.
fn packed(g: &Graph, qkv: [NodeId; 3]) -> Option<(NodeId, [usize; 5])> {
    let d = g.ty(qkv[0]).shape.dims().to_vec();
    let (b, t, h, hd) = (d[0], d[1], d[2], d[3]);
    let c = h * hd;
    let mut source = None;
    for (slot, &x) in qkv.iter().enumerate() {
        if g.ty(x).shape.dims() != d.as_slice() {
            return None;
        }
        let n = g.node(x);
        if !matches!(n.op, Op::Reshape) {
            return None;
        }
        let s = g.node(n.inputs[0]);
        let Op::Slice { axis, start, end } = s.op else {
            return None;
        };
        let from = s.inputs[0];
        let fd = g.ty(from).shape.dims();
        let fits = fd == [b, t, 3 * c] && axis == 2 && start == slot * c && end == start + c;
        if !fits || source.is_some_and(|y| y != from) {
            return None;
        }
        source = Some(from);
    }
    source.map(|y| (y, [b, t, 3, h, hd]))
}
