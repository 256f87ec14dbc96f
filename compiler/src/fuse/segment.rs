//! Segments of a forward pass that can be recomputed whole for the backward pass, as PyTorch's
//! `torch.utils.checkpoint` recomputes a block from its input.
//!
//! A *cut* is a forward value after which it is the only value of the batch still to be read
//! by the forward pass: everything computed before it that the forward pass reads later is it.
//! A transformer block's residual input (and the residual between its attention and its MLP)
//! and a ResNet block's output are cuts; so is each activation of an MLP. Cuts are found from
//! the graph's structure alone (which values the forward pass reads where), never from names,
//! so built-in, IR-text and imported models get the same segments.
//!
//! A *piece* is what lies strictly between two cuts, with at least one library call in it
//! (a run of cuts with only elementwise work between them, as a residual add and its ReLU,
//! counts as its last one). Recomputing a piece ([`super::remat::recompute_with`] with the
//! piece's nodes) keeps the cut before it and the one after it, and drops everything inside
//! that the backward pass would read (batch-norm and ReLU outputs, LayerNorm outputs, matmul
//! and attention outputs, masks); the backward pass recomputes the piece's forward from the
//! cut before it when it first needs one of those values, just before the piece's own backward
//! part. Pieces grouped ([`grouped`]) drop the cuts between them too, as checkpointing a
//! whole transformer block keeps only its input where the piece keeps its input and the
//! residual between attention and MLP.
//!
//! Reductions (LayerNorm and batch-norm statistics, softmax rows) are not recomputed: a copy
//! reads the row the forward pass stored, which is small, and summing again could not change
//! the bits but would cost a pass over the input.

use super::remat::{forward_ends, forward_nodes, pinned, read_by_backward};
use super::select::{forced, shared};
use super::{kind, Kind};
use crate::ir::{Graph, LeafKind, NodeId, Op};

/// A run of forward nodes recomputed whole for the backward pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The nodes recomputed (ids of the graph fusion recomputes in, [`super::prepared`]), in
    /// node order: every node of the run that depends on the batch, reductions, leaves, step
    /// outputs and updates aside.
    pub nodes: Vec<NodeId>,
    /// The cut it is recomputed from (kept), if any: a first segment starts from the batch.
    pub input: Option<NodeId>,
    /// The cut after it (kept: the next segment's input).
    pub output: NodeId,
    /// The bytes of the values inside it fusion stores and the backward pass reads: what
    /// recomputing it frees at most (some of them fusion's cheap recomputation frees anyway).
    pub bytes: usize,
    /// The arithmetic of recomputing it ([`crate::flops::of_node`] of its nodes).
    pub flops: u64,
    /// Which forward pass (micro-batch) it belongs to, from 0.
    pub pass: usize,
    /// Whether `output` may be recomputed when the next piece is grouped with this one (not a
    /// reduction, step output or update).
    pub output_recomputable: bool,
}

impl Segment {
    /// The node that names it in the report: its first library call (a block's first
    /// LayerNorm is often fused with the residual add before it; its first matmul is its own).
    pub fn first(&self, g: &Graph) -> NodeId {
        self.nodes
            .iter()
            .copied()
            .find(|&n| kind(g.node(n)) == Kind::Library)
            .unwrap_or(self.nodes[0])
    }
}

/// Which nodes depend on the step's inputs (the batch): what a segment recomputes. Weights'
/// casts and causal masks depend on parameters and constants only; a copy reads them.
fn batch_dependent(g: &Graph) -> Vec<bool> {
    let mut d = vec![false; g.len()];
    for id in g.ids() {
        let n = g.node(id);
        d[id.index()] = match &n.op {
            Op::Leaf { kind, .. } => *kind == LeafKind::Input,
            _ => n.inputs.iter().any(|x| d[x.index()]),
        };
    }
    d
}

/// The finest segments of `g`'s forward passes: one per piece between two cuts (see the
/// module docs), in node order. The piece holding a pass's loss is never one (its last library
/// call's copy would only be a second one). Empty for a graph without a loss.
pub fn pieces(g: &Graph, recompute_ops: usize) -> Vec<Segment> {
    let Some(ends) = forward_ends(g) else {
        return Vec::new();
    };
    let forward = forward_nodes(g, &ends);
    let pinned = pinned(g);
    let dep = batch_dependent(g);
    let mut stored = forced(g);
    shared(g, &mut stored, recompute_ops);
    let read_late = read_by_backward(g, &ends, &stored);
    let users = g.users();
    let mut out = Vec::new();
    for (pass, &end) in ends.iter().enumerate() {
        let start = if pass == 0 {
            0
        } else {
            ends[pass - 1].index() + 1
        };
        let in_pass = |i: usize| {
            i >= start
                && i <= end.index()
                && forward[i]
                && dep[i]
                && !g.node(NodeId(i as u32)).op.is_leaf()
        };
        // open[p]: how many of the pass's values computed at or before p the pass reads after p.
        let mut delta = vec![0i64; end.index() + 2];
        let mut last_use = vec![0usize; end.index() + 1];
        for i in start..=end.index() {
            if !in_pass(i) {
                continue;
            }
            let last = users[i]
                .iter()
                .map(|u| u.index())
                .filter(|&u| u <= end.index() && forward[u])
                .max()
                .unwrap_or(i);
            last_use[i] = last;
            if last > i {
                delta[i] += 1;
                delta[last] -= 1;
            }
        }
        let mut open = 0i64;
        let mut cuts: Vec<usize> = Vec::new();
        // Whether a library call lies after the last cut, up to the node at hand.
        let mut library_since = false;
        for (i, d) in delta.iter().enumerate().take(end.index()).skip(start) {
            open += d;
            if !in_pass(i) {
                continue;
            }
            if kind(g.node(NodeId(i as u32))) == Kind::Library {
                library_since = true;
            }
            if open == 1 && last_use[i] > i {
                // A run of cuts with no library call among them (a bias add and its ReLU
                // after a product, a residual add and its ReLU): the last one stands.
                if !library_since {
                    cuts.pop();
                }
                cuts.push(i);
                library_since = false;
            }
        }
        // The pass's last library call (a language model's head): a piece holding it is not
        // a segment (its copy would be made where the forward value is still live).
        let last_library = (start..end.index())
            .rev()
            .find(|&i| in_pass(i) && kind(g.node(NodeId(i as u32))) == Kind::Library);
        let mut input: Option<usize> = None;
        for &cut in &cuts {
            let from = input.map_or(start, |c| c + 1);
            // A cut that is a view (a reshape before a matmul) keeps the value under it.
            let chain = alias_chain(g, NodeId(cut as u32));
            let nodes: Vec<NodeId> = (from..cut)
                .filter(|&i| in_pass(i) && !pinned[i])
                .map(|i| NodeId(i as u32))
                .filter(|&n| kind(g.node(n)) != Kind::Reduce && !chain.contains(&n))
                .collect();
            if last_library.is_some_and(|l| from <= l && l < cut) {
                input = Some(cut);
                continue;
            }
            let bytes: usize = nodes
                .iter()
                .filter(|n| stored[n.index()] && read_late[n.index()])
                .map(|&n| g.ty(n).bytes())
                .sum();
            // A piece with no library call is cheap work fusion recomputes anyway; one that
            // keeps nothing for the backward pass frees nothing.
            if bytes > 0 && nodes.iter().any(|&n| kind(g.node(n)) == Kind::Library) {
                let flops = nodes.iter().map(|&n| crate::flops::of_node(g, n)).sum();
                out.push(Segment {
                    nodes,
                    input: input.map(|c| NodeId(c as u32)),
                    output: NodeId(cut as u32),
                    bytes,
                    flops,
                    pass,
                    output_recomputable: chain
                        .iter()
                        .all(|&n| !pinned[n.index()] && kind(g.node(n)) != Kind::Reduce),
                });
            }
            input = Some(cut);
        }
        // (The piece after the last cut holds the loss: not a segment.)
    }
    out
}

/// `pieces` grouped `group` at a time within each forward pass, the first group of each pass
/// holding `offset` of them when `offset` is not 0 (so that groups of two can start at a
/// transformer block's input or at its residual between attention and MLP, whichever the
/// fitter finds better): a group recomputes the cuts between its pieces too, and keeps only
/// the cut before it and the one after it.
pub fn grouped(g: &Graph, pieces: &[Segment], group: usize, offset: usize) -> Vec<Segment> {
    let group = group.max(1);
    let mut out: Vec<Segment> = Vec::new();
    // Pieces in the current group, and the size it may reach.
    let (mut taken, mut size) = (0, 0);
    for (k, p) in pieces.iter().enumerate() {
        let first_of_pass = k == 0 || pieces[k - 1].pass != p.pass;
        if first_of_pass {
            (taken, size) = (0, if offset > 0 { offset } else { group });
        }
        let joins = !first_of_pass
            && taken > 0
            && taken < size
            && Some(pieces[k - 1].output) == p.input
            && pieces[k - 1].output_recomputable;
        if joins {
            let last = out.last_mut().expect("a group is open");
            let cut = last.output;
            let chain = alias_chain(g, cut);
            last.bytes += p.bytes + g.ty(cut).bytes();
            last.flops += chain
                .iter()
                .map(|&n| crate::flops::of_node(g, n))
                .sum::<u64>()
                + p.flops;
            last.nodes.extend(chain);
            last.nodes.extend(p.nodes.iter().copied());
            last.nodes.sort();
            last.output = p.output;
            last.output_recomputable = p.output_recomputable;
            taken += 1;
        } else {
            if taken > 0 {
                size = group;
            }
            out.push(p.clone());
            taken = 1;
        }
    }
    out
}

/// `x` and the values under it through aliases (reshapes): the one stored value they stand for.
fn alias_chain(g: &Graph, x: NodeId) -> Vec<NodeId> {
    let mut chain = vec![x];
    while g.node(*chain.last().expect("nonempty")).op.is_alias() {
        chain.push(g.node(*chain.last().expect("nonempty")).inputs[0]);
    }
    chain
}
