//! Outputs no one reads: after merging, a producer's root that only its consumer read is
//! computed inside the merged kernel, and storing it as well writes a buffer that no kernel
//! loads.
//!
//! A batch norm's output plus a residual, followed by a ReLU, is the common case (issue 48): the
//! sum is stored because the ReLU's mask and its value both read it; once the sum's kernel is
//! folded into the ReLU's, the merged kernel still wrote the sum, an f32 tensor of the
//! activation's size (411 MB a block at resnet50's 56x56 stage, batch 128), and nothing read
//! it. The values kept are computed exactly as before (the body is the same expansion, less
//! the store), so a step's results do not change; its plan and its kernels' traffic shrink.
//! That includes bf16 rounding: the rest of a kernel reads a bf16 value the kernel stores
//! rounded, as stored ([`super::widen`]), and a dropped root keeps that rounding
//! ([`Lowered::unstored`](super::lower::Lowered::unstored)). Lowered again as a plain interior
//! value, it was read unrounded, and the random bf16 steps 1498461 and 1686696 moved 2 and 10
//! times as far from the f32 step as the reference (which rounds every op) is.

use super::group::Group;
use super::kind::{kind, Kind};
use super::lower::lower_unstored;
use super::select::base;
use crate::ir::{Graph, NodeId, Op};

/// `groups` with each root that nothing loads (no kernel, no library call, no step output or
/// update) left out of its group's outputs, the group lowered again without it. Only
/// full-size roots of groups with several are left out: a row-level root (a reduction) is a
/// handful of bytes, and a group keeps at least one root. A group whose lowering without them
/// fails is kept as it was.
pub(super) fn drop_unread_roots(g: &Graph, mat: &[bool], groups: Vec<Group>) -> Vec<Group> {
    let read = read_values(g, &groups);
    let unread = |gr: &Group, r: NodeId| {
        !read[r.index()]
            && !matches!(g.node(r).op, Op::Reduce { .. })
            && g.ty(r).shape.dims() == gr.domain.dims.as_slice()
    };
    let mut mat = mat.to_vec();
    let mut changed = false;
    for gr in &groups {
        if gr.roots.len() > 1 {
            for &r in gr.roots.iter().filter(|&&r| unread(gr, r)) {
                mat[r.index()] = false;
                changed = true;
            }
        }
    }
    if !changed {
        return groups;
    }
    groups
        .into_iter()
        .map(|gr| {
            if gr.roots.len() < 2 {
                return gr;
            }
            let kept: Vec<NodeId> = gr
                .roots
                .iter()
                .copied()
                .filter(|&r| !unread(&gr, r))
                .collect();
            if kept.len() == gr.roots.len() || kept.is_empty() {
                return gr;
            }
            let dropped: Vec<NodeId> = (gr.roots.iter().copied())
                .filter(|&r| unread(&gr, r))
                .collect();
            match lower_unstored(g, &mat, &kept, &gr.domain, &dropped) {
                Ok(lowered) => Group {
                    roots: kept,
                    domain: gr.domain,
                    lowered,
                },
                Err(_) => gr,
            }
        })
        .collect()
}

/// For each node, whether something reads its buffer: a group's load, a library call's operand
/// or a step output or update, each through its views to the value that owns the bytes.
fn read_values(g: &Graph, groups: &[Group]) -> Vec<bool> {
    let mut read = vec![false; g.len()];
    let mut mark = |x: NodeId| read[base(g, x).index()] = true;
    for gr in groups {
        gr.lowered.inputs.iter().for_each(|&x| mark(x));
    }
    for id in g.ids() {
        if kind(g.node(id)) == Kind::Library {
            g.node(id).inputs.iter().for_each(|&x| mark(x));
        }
    }
    g.outputs.values().for_each(|&o| mark(o));
    g.updates.iter().for_each(|u| mark(u.value));
    read
}
