//! Sinking: each node moved down the schedule to just before the first node that needs it,
//! where that cannot raise the bytes live.
//!
//! Recomputation for the backward pass ([`crate::fuse::remat`], [`crate::fuse::segment`])
//! gives the backward readers of a forward value their own copy of its expression. That copy
//! frees memory only if it runs late: a copy run right after the loss (because the first node
//! that reads it in node order, a GELU's derivative that reads only forward values, sits
//! there, or because the memory-aware schedule found it ready) holds its bytes through the
//! whole backward pass of the layers after it, which is what recomputing was to avoid. The
//! plans of steps that recompute ([`crate::plan::PlanOptions::sink`]) therefore sink their
//! schedule: every node runs as late as its first dependent allows, provided that moving it
//! there keeps no other value alive longer than it shortens its own outputs' lives.
//!
//! The pass is linear in nodes and dependences: one backward sweep decides, from the nodes
//! after each one, where it will run (its *anchor*: the first node that stays in place and
//! needs it, through nodes that move); one forward sweep emits each node that stays, preceded
//! by the moved nodes anchored to it, laid out backwards from it so that each lands right
//! before the first of them that needs it, with nothing between but what that one needs.
//!
//! What a move may cost: a node `v` at position `p` moved to just before anchor `a` stops
//! holding its outputs over `(p, a)`. It keeps alive longer only the operands it read last,
//! and only those no node after it reads before `a` (a later reader's own last read, and so
//! its right to write over the operand in place, is never taken over); the move is made only
//! when those operands' bytes are at most its outputs' bytes. So at every position that stays
//! the bytes live do not grow, and each value still dies at the node it died at. Where a moved
//! node lands, though, it meets the values live there, which a chain of moved nodes (with
//! their temporaries and scratch) did not meet where it was: the planner keeps the sunk
//! schedule only when its LOAD is no higher ([`crate::plan::plan`]).

use super::align::align_up;
use super::liveness::WorkspaceFn;
use crate::ir::{Graph, NodeId};
use petgraph::graph::NodeIndex;
use petgraph::Direction;

/// `order` (a valid schedule of `g`) with every node that can sink without raising the bytes
/// live moved to just before the first node that needs it (see the module docs). The result
/// is a valid schedule: each node still runs after all its dependences (data and update
/// order, [`crate::schedule::dependences`]) and before all its dependents.
///
/// `workspace` is the target's scratch need per node ([`crate::plan::PlanOptions::workspace`]):
/// a node whose scratch is filled from an operand ([`crate::plan::WorkspaceNeed::filled_from`])
/// holds it from that operand on, so it does not move.
pub fn sink(g: &Graph, order: &[NodeId], workspace: Option<WorkspaceFn>) -> Vec<NodeId> {
    let n = order.len();
    if n != g.len() {
        // Not a schedule of `g` (the planner reports a missing node itself).
        return order.to_vec();
    }
    let d = crate::schedule::dependences(g);
    let mut pos = vec![0usize; n];
    for (p, &id) in order.iter().enumerate() {
        pos[id.index()] = p;
    }
    let anchor = anchors(g, &d, order, workspace);
    emit(&d, order, &pos, &anchor)
}

/// Where each node will run, as the position (in `order`) of the node that stays in place
/// before which it is emitted: its own position when it stays. Decided from the last node
/// back, so every dependent of a node is decided before it.
fn anchors(
    g: &Graph,
    d: &petgraph::graph::DiGraph<NodeId, ()>,
    order: &[NodeId],
    workspace: Option<WorkspaceFn>,
) -> Vec<usize> {
    let n = order.len();
    let kernel_outputs = g.kernel_outputs();
    // Each value's bytes are its storage's: a view stands for the value under it.
    let mut root: Vec<NodeId> = g.ids().collect();
    for id in g.ids() {
        if g.node(id).op.is_alias() {
            root[id.index()] = root[g.node(id).inputs[0].index()];
        }
    }
    // Values whose bytes outlive the step or are not the slab's to free: leaves (resident),
    // step outputs and update values (read at the step's end).
    let mut lasting = vec![false; n];
    for id in g.ids() {
        lasting[root[id.index()].index()] |= g.node(id).op.is_leaf();
    }
    for &o in g.outputs.values() {
        lasting[root[o.index()].index()] = true;
    }
    for u in &g.updates {
        lasting[root[u.value.index()].index()] = true;
    }
    // The latest anchor among the readers decided so far (those after the node at hand), per
    // value; `None` while none is.
    let mut last_read: Vec<Option<usize>> = vec![None; n];
    let mut anchor = vec![0usize; n];
    let mut seen: Vec<NodeId> = Vec::new();
    for p in (0..n).rev() {
        let v = order[p];
        let first = d
            .neighbors_directed(NodeIndex::new(v.index()), Direction::Outgoing)
            .map(|s| anchor[s.index()])
            .min();
        seen.clear();
        for &x in g.reads(v) {
            let r = root[x.index()];
            if !seen.contains(&r) {
                seen.push(r);
            }
        }
        let to = first.filter(|&a| {
            a > p + 1 && movable(g, v, workspace) && {
                // The bytes the move keeps alive longer, at most the outputs' own.
                let mut kept = 0usize;
                let mut stolen = false;
                for &r in &seen {
                    if lasting[r.index()] {
                        continue;
                    }
                    match last_read[r.index()] {
                        Some(l) if l >= a => {}
                        // A later reader would no longer be the last: it could lose its
                        // place over the operand's bytes.
                        Some(_) => stolen = true,
                        None => kept += align_up(g.ty(r).bytes()),
                    }
                }
                let own: usize = kernel_outputs[v.index()]
                    .iter()
                    .map(|&o| align_up(g.ty(o).bytes()))
                    .sum();
                !stolen && kept <= own
            }
        });
        anchor[v.index()] = to.unwrap_or(p);
        for &r in &seen {
            let l = &mut last_read[r.index()];
            *l = Some(l.map_or(anchor[v.index()], |l| l.max(anchor[v.index()])));
        }
    }
    // A node anchored where it stands stays; positions are anchors only of nodes that stay.
    debug_assert!(order
        .iter()
        .all(|&v| anchor[order[anchor[v.index()]].index()] == anchor[v.index()]));
    anchor
}

/// Whether `v` may move at all: not a leaf (leaves cost nothing and are taken first), not a
/// collective or one of its results (their place is decided by [`crate::schedule::hoist_collectives`]),
/// not a node whose scratch is filled from an operand.
fn movable(g: &Graph, v: NodeId, workspace: Option<WorkspaceFn>) -> bool {
    let op = &g.node(g.writer(v)).op;
    !op.is_leaf()
        && !op.is_collective()
        && workspace.is_none_or(|ws| ws(g, v).filled_from.is_none())
}

/// The new order: each node that stays, preceded by the moved nodes anchored to it. Those are
/// laid out backwards from it: a moved node is placed once every dependent of it that runs
/// at the same anchor is, so it lands right before the first of them, with nothing between
/// but what that dependent needs too.
fn emit(
    d: &petgraph::graph::DiGraph<NodeId, ()>,
    order: &[NodeId],
    pos: &[usize],
    anchor: &[usize],
) -> Vec<NodeId> {
    let n = order.len();
    let stays = |i: usize| anchor[i] == pos[i];
    // For each moved node, its dependents that run at its anchor (moved there, or the anchor
    // itself) and are not placed yet.
    let mut waiting: Vec<usize> = (0..n)
        .map(|i| {
            if stays(i) {
                return 0;
            }
            d.neighbors_directed(NodeIndex::new(i), Direction::Outgoing)
                .filter(|s| anchor[s.index()] == anchor[i])
                .count()
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    // The moved nodes of one anchor, last first.
    let mut bucket: Vec<usize> = Vec::new();
    let mut ready: Vec<usize> = Vec::new();
    let mut preds: Vec<usize> = Vec::new();
    for &v in order {
        let v = v.index();
        if !stays(v) {
            continue;
        }
        bucket.clear();
        ready.push(v);
        while let Some(u) = ready.pop() {
            if u != v {
                bucket.push(u);
            }
            preds.clear();
            preds.extend(
                d.neighbors_directed(NodeIndex::new(u), Direction::Incoming)
                    .map(|q| q.index())
                    .filter(|&q| !stays(q) && anchor[q] == pos[v]),
            );
            // Of the dependences ready together, the latest in the old order is placed
            // nearest (pushed last, popped first).
            preds.sort_by_key(|&q| pos[q]);
            for &q in &preds {
                waiting[q] -= 1;
                if waiting[q] == 0 {
                    ready.push(q);
                }
            }
        }
        out.extend(bucket.iter().rev().map(|&u| NodeId(u as u32)));
        out.push(NodeId(v as u32));
    }
    out
}
