//! Which values reach memory. Everything else is computed inside the kernels that use it.
//!
//! A value is *materialized* (written to a buffer) when something outside a fused kernel needs
//! its bytes: a leaf, a library call (matmul, gather, scatter-add, concat) and its operands, a
//! step output or update; and so is each running sum of accumulated gradients (see
//! [`crate::autodiff::accumulate::ACCUMULATION`]). Any other value is inlined into every kernel that uses it, which is
//! free when one kernel uses it and a recomputation when several do. A shared value is
//! recomputed only when that is cheap (few ops) and does not keep more bytes alive than storing
//! it would (its inputs are no larger than it, within an eighth); otherwise it is stored. A
//! shared value broadcast to 64 times its size or more is stored too (computed once per row,
//! not once per element). A shared reduction is stored (it is a row of scalars; the kernel merge usually computes it as
//! an extra output of the first kernel that needs it).

use super::kind::{kind, Kind};
use crate::ir::{Graph, NodeId, Op};
use smallvec::SmallVec;

/// The value a view chain of aliases (reshape, stop-gradient) stands for.
pub fn base(g: &Graph, mut x: NodeId) -> NodeId {
    while g.node(x).op.is_alias() {
        x = g.node(x).inputs[0];
    }
    x
}

/// The values that must be materialized whatever the kernels look like.
pub fn forced(g: &Graph) -> Vec<bool> {
    let mut mat = vec![false; g.len()];
    for id in g.ids() {
        match kind(g.node(id)) {
            Kind::Leaf => mat[id.index()] = true,
            Kind::Library => {
                mat[id.index()] = true;
                for &x in &g.node(id).inputs {
                    mat[base(g, x).index()] = true;
                }
            }
            _ => {}
        }
    }
    for &o in g.outputs.values() {
        mat[base(g, o).index()] = true;
    }
    for u in &g.updates {
        mat[base(g, u.value).index()] = true;
    }
    // Running sums of accumulated gradients, each added when its micro-batch is done.
    for id in g.ids() {
        if is_accumulation(g, id) {
            mat[id.index()] = true;
        }
    }
    mat
}

/// Whether `id` is a running sum of accumulated gradients
/// ([`crate::autodiff::accumulate::ACCUMULATION`]).
pub fn is_accumulation(g: &Graph, id: NodeId) -> bool {
    kind(g.node(id)) == Kind::Elementwise
        && g.origin(id)
            .sources()
            .iter()
            .any(|s| &**s == crate::autodiff::accumulate::ACCUMULATION)
}

/// Marks shared values that should be stored rather than recomputed (see the module docs).
/// Only ever adds to `mat`.
pub fn shared(g: &Graph, mat: &mut [bool], recompute_ops: usize) {
    let users = g.users();
    // The (at most two) kernels that compute each value: enough to tell "one" from "several".
    let mut kernels: Vec<SmallVec<[u32; 2]>> = vec![SmallVec::new(); g.len()];
    for v in (0..g.len() as u32).rev().map(NodeId) {
        let mut k: SmallVec<[u32; 2]> = SmallVec::new();
        for &u in &users[v.index()] {
            let from: SmallVec<[u32; 2]> = if mat[u.index()] {
                smallvec::smallvec![u.0]
            } else {
                kernels[u.index()].clone()
            };
            for x in from {
                if k.len() < 2 && !k.contains(&x) {
                    k.push(x);
                }
            }
        }
        let i = v.index();
        if !mat[i] && k.len() >= 2 {
            mat[i] = match kind(g.node(v)) {
                Kind::Reduce => true,
                // A small value broadcast across many elements (a row's 1/sqrt(var + eps))
                // is computed once and read, not recomputed at every element it reaches.
                // Unless it reads nothing: a causal mask computed from its indices costs a
                // compare where it is used, and loading it would cost a load.
                Kind::Elementwise if widely_broadcast(g, &users[v.index()], v) => {
                    !computed_from_indices(g, mat, v, recompute_ops)
                }
                Kind::Elementwise | Kind::View => !cheap_to_recompute(g, mat, v, recompute_ops),
                _ => false,
            };
        }
        kernels[i] = k;
    }
}

/// Whether `v`'s inlined expression reads no memory (iotas and constants only, no leaf, no
/// stored value) and has at most `limit` ops: computing it where it is used costs less than
/// any load of it.
fn computed_from_indices(g: &Graph, mat: &[bool], v: NodeId, limit: usize) -> bool {
    let mut stack = vec![v];
    let mut seen: Vec<NodeId> = vec![v];
    let mut ops = 0usize;
    while let Some(x) = stack.pop() {
        match kind(g.node(x)) {
            Kind::Source => continue,
            Kind::Elementwise => ops += 1,
            Kind::View | Kind::Alias => {}
            _ => return false,
        }
        if x != v && mat[x.index()] || ops > limit {
            return false;
        }
        for &y in &g.node(x).inputs {
            if !seen.contains(&y) {
                seen.push(y);
                stack.push(y);
            }
        }
    }
    true
}

/// Whether some user broadcasts `v` to at least 64 times its elements.
fn widely_broadcast(g: &Graph, users: &[NodeId], v: NodeId) -> bool {
    let n = g.ty(v).shape.numel().max(1);
    users
        .iter()
        .any(|&u| matches!(g.node(u).op, Op::Broadcast) && g.ty(u).shape.numel() >= 64 * n)
}

/// True when `v`'s inlined expression has at most `limit` ops and its inputs (values it would
/// load, parameters and inputs excluded since they stay resident anyway) take at most
/// `bytes(v) * 9 / 8`.
pub(crate) fn cheap_to_recompute(g: &Graph, mat: &[bool], v: NodeId, limit: usize) -> bool {
    let mut stack = vec![v];
    let mut seen: Vec<NodeId> = vec![v];
    let mut ops = 0usize;
    let mut frontier_bytes = 0usize;
    while let Some(x) = stack.pop() {
        for &y in &g.node(x).inputs {
            if seen.contains(&y) {
                continue;
            }
            seen.push(y);
            let node = g.node(y);
            match kind(node) {
                Kind::Leaf | Kind::Source => {}
                _ if mat[y.index()] || kind(node) == Kind::Reduce => {
                    frontier_bytes += node.ty.bytes();
                }
                Kind::Elementwise => {
                    ops += 1;
                    stack.push(y);
                }
                _ => stack.push(y),
            }
            if ops > limit || seen.len() > 8 * limit {
                return false;
            }
        }
    }
    let own = g.ty(v).bytes();
    let own_ops = usize::from(matches!(
        g.node(v).op,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert
    ));
    ops + own_ops <= limit && frontier_bytes <= own + own / 8
}
