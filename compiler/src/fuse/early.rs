//! Late slices copied early: a stored value that every kernel but one has finished with, kept
//! alive only because that one reads a slice of it much later, is copied down to the slice as
//! soon as the others are done, so the whole value dies there instead.
//!
//! A U-Net's skip connection makes one: the gradient of a decoder convolution's input (the
//! concat of the upsampled path and the skip) is read at once for the upsampled channels, and
//! the skip's channels are read only at the end of the backward pass, where the encoder's own
//! gradient is added to them. Inlined into that late kernel, the slice held the whole gradient
//! (three times the slice) through everything in between.
//!
//! The decision is made before fusion groups anything, from the step's traced order (node ids)
//! and what must be stored whatever the kernels look like ([`super::select::forced`]), both on
//! the safe side: a slice is copied only where the first node reading it comes at least
//! [`MIN_GAP`] nodes after the last read of the rest of its value could reach. The copy is a
//! kernel of its own that fusion's merging leaves alone, emitted right after the last kernel
//! that reads the rest of its value ([`copy_keys`]): the bytes it holds are the slice's, from
//! there on.

use super::kind::{kind, Kind};
use crate::ir::{Graph, NodeId, Op};
use std::collections::BTreeSet;

/// The fewest nodes of the traced step between the last read of a value's other readers and
/// the first read of its slice for the slice to be copied early. Nearby reads (the query, key
/// and value slices of one projection, read by one attention) are left as they are: the whole
/// value would die a few nodes later anyway, and the copy would cost a kernel and its bytes
/// for nothing.
pub const MIN_GAP: usize = 64;

/// The slices to copy early; `forced` is [`super::select::forced`]`(g)`.
///
/// A candidate is a slice (not stored otherwise) at most half its value's size, reached from a
/// stored value that is not a leaf through views only (slices, transposes, broadcasts,
/// reshapes, none of them stored). The rest of that value is read by the other users of each
/// node on that chain; each such read can reach no further than the first stored value down
/// its users (`last_reach`: every path ends at a stored value). The slice's own kernel reads
/// the value no earlier than the first user of the slice.
pub fn early_slices(g: &Graph, forced: &[bool]) -> BTreeSet<NodeId> {
    let mut early = BTreeSet::new();
    if !g.ids().any(|id| matches!(g.node(id).op, Op::Slice { .. })) {
        return early;
    }
    let users = g.users();
    let reach = last_reach(g, forced, &users);
    for s in g.ids() {
        if !matches!(g.node(s).op, Op::Slice { .. }) || forced[s.index()] {
            continue;
        }
        let Some(&first) = users[s.index()].iter().min() else {
            continue;
        };
        // Up the chain of views to the stored value, noting the latest other read on the way.
        let mut below = s;
        let mut other = 0usize;
        let x = loop {
            let above = g.node(below).inputs[0];
            for &u in &users[above.index()] {
                if u != below {
                    other = other.max(reach[u.index()]);
                }
            }
            if forced[above.index()] {
                break Some(above);
            }
            if !matches!(kind(g.node(above)), Kind::View | Kind::Alias) {
                break None;
            }
            below = above;
        };
        let Some(x) = x else { continue };
        let shrinks = 2 * g.ty(s).bytes() <= g.ty(x).bytes();
        // `other` is 0 when nothing else reads x: then x lives for the slice alone.
        if shrinks && !g.node(x).op.is_leaf() && other > 0 && first.index() >= other + MIN_GAP {
            early.insert(s);
        }
    }
    early
}

/// For each node, the latest node its value can be read at: itself if it is stored whatever
/// the kernels look like, otherwise the latest such reach of its users (it is computed inside
/// the kernels of stored values downstream, each no later than the first stored value on its
/// path), or itself when nothing uses it.
fn last_reach(g: &Graph, forced: &[bool], users: &crate::ir::Users) -> Vec<usize> {
    let mut reach = vec![0usize; g.len()];
    for v in (0..g.len()).rev() {
        reach[v] = if forced[v] {
            v
        } else {
            users[v].iter().map(|u| reach[u.index()]).max().unwrap_or(v)
        };
    }
    reach
}

/// The emitting keys of fusion's units (kernels and library calls, each keyed by its first
/// root, `keys`), with each early copy (`copies`) keyed just after the latest other unit that
/// reads what it reads (`reads`: the stored values each unit reads): emitted in key order as
/// their operands allow, the copy then runs as soon as the rest of its value is done with.
/// Other copies do not count as reads of the rest; a copy no other unit shares a value with
/// keeps its key.
pub fn copy_keys(keys: &[NodeId], reads: &[Vec<NodeId>], copies: &[bool]) -> Vec<NodeId> {
    let mut out = keys.to_vec();
    for (i, key) in out.iter_mut().enumerate().filter(|(i, _)| copies[*i]) {
        let last = (0..keys.len())
            .filter(|&j| j != i && !copies[j])
            .filter(|&j| reads[j].iter().any(|x| reads[i].contains(x)))
            .map(|j| keys[j])
            .max();
        if let Some(last) = last {
            *key = NodeId(last.0 + 1);
        }
    }
    out
}
