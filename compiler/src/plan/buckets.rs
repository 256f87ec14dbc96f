//! The data-parallel part of a plan: each gradient bucket's all-reduce, where its one region
//! lies, when it runs, and how much of the backward pass is left to overlap it; and each
//! all-gather that replaces a gradient's all-reduce (`autodiff::buckets::gathered`); and each
//! reduce-scatter that gives a sharded update its rows of the sum (`autodiff::shard`). Every
//! rank runs the same plan on its own device: the plan's total is per rank.

use super::MemoryPlan;
use crate::autodiff::phase;
use crate::ir::{Graph, NodeId, Op};
use serde::Serialize;

/// One bucket's all-reduce in the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// The all-reduce node.
    pub node: NodeId,
    pub ranks: usize,
    /// Gradients in the bucket.
    pub gradients: usize,
    /// Their bytes (without the alignment padding between them).
    pub bytes: usize,
    /// The one region the collective runs on: absolute offset and bytes (padding included).
    pub offset: usize,
    pub region_bytes: usize,
    /// Schedule position of the all-reduce.
    pub position: usize,
    /// The layer whose gradient completes the bucket (the provenance of its last operand).
    pub after: String,
    /// Backward-pass ops scheduled after the all-reduce: the work it can overlap.
    pub backward_after: usize,
}

/// The buckets of a planned step, in schedule order (none for a one-rank step).
pub fn buckets(g: &Graph, plan: &MemoryPlan) -> Vec<Bucket> {
    let outputs = g.kernel_outputs();
    let phases = phase::of_graph(g, g.outputs.get(crate::autodiff::LOSS).copied());
    let mut out: Vec<Bucket> = plan
        .liveness
        .order
        .iter()
        .enumerate()
        .filter_map(|(position, &id)| {
            let Op::AllReduce { ranks } = g.node(id).op else {
                return None;
            };
            let outs = &outputs[id.index()];
            let (first, last) = (
                plan.location(g, outs[0]),
                plan.location(g, outs[outs.len() - 1]),
            );
            let last_operand = *g.node(id).inputs.iter().max()?;
            let backward_after = plan.liveness.order[position + 1..]
                .iter()
                .filter(|n| phases[n.index()] == phase::Phase::Backward)
                .filter(|n| {
                    !matches!(
                        g.node(**n).op,
                        Op::Result { .. } | Op::AllReduce { .. } | Op::ReduceScatter { .. }
                    )
                })
                .count();
            Some(Bucket {
                node: id,
                ranks,
                gradients: outs.len(),
                bytes: outs.iter().map(|&o| g.ty(o).bytes()).sum(),
                offset: first.offset,
                region_bytes: last.offset + last.bytes - first.offset,
                position,
                after: g.describe(g.writer(last_operand)),
                backward_after,
            })
        })
        .collect();
    out.sort_by_key(|b| b.position);
    out
}

/// The buckets as a table, with the per-rank line; empty for a one-rank step.
pub fn table(buckets: &[Bucket], plan: &MemoryPlan) -> String {
    use std::fmt::Write;
    let Some(first) = buckets.first() else {
        return String::new();
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "data parallel: {} ranks, each runs this plan on its own device ({} bytes per rank); {} all-reduce bucket{} of {} bytes of gradients",
        first.ranks,
        plan.total_bytes,
        buckets.len(),
        if buckets.len() == 1 { "" } else { "s" },
        buckets.iter().map(|b| b.bytes).sum::<usize>()
    );
    let _ = writeln!(
        s,
        "{:>6}  {:>9}  {:>12}  {:>12}  {:>12}  {:>8}  {:>12}  after",
        "bucket", "gradients", "bytes", "offset", "region", "position", "backward ops"
    );
    for (k, b) in buckets.iter().enumerate() {
        let _ = writeln!(
            s,
            "{:>6}  {:>9}  {:>12}  {:>12}  {:>12}  {:>8}  {:>12}  {}",
            k,
            b.gradients,
            b.bytes,
            b.offset,
            b.region_bytes,
            b.position,
            b.backward_after,
            b.after
        );
    }
    s
}

/// One all-gather in the plan: a gradient's operands gathered from every rank instead of the
/// gradient all-reduced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gather {
    /// The all-gather node.
    pub node: NodeId,
    pub ranks: usize,
    /// Bytes this rank sends (its operand) and holds after it (every rank's, concatenated).
    pub bytes: usize,
    pub gathered_bytes: usize,
    /// Schedule position of the all-gather.
    pub position: usize,
    /// What the operand is (its provenance).
    pub of: String,
}

/// The all-gathers of a planned step, in schedule order (none for a one-rank step).
pub fn gathers(g: &Graph, plan: &MemoryPlan) -> Vec<Gather> {
    in_schedule(plan, |position, id| {
        let Op::AllGather { ranks } = g.node(id).op else {
            return None;
        };
        let x = *g.node(id).inputs.first()?;
        Some(Gather {
            node: id,
            ranks,
            bytes: g.ty(x).bytes(),
            gathered_bytes: g.ty(id).bytes(),
            position,
            of: g.describe(g.writer(x)),
        })
    })
}

/// The all-gathers, one line each; empty for a step without them.
pub fn gather_table(gathers: &[Gather]) -> String {
    one_line_each(gathers, |x| {
        format!(
            "all-gather over {} ranks at position {}: {} bytes a rank of {} ({} bytes gathered)",
            x.ranks, x.position, x.bytes, x.of, x.gathered_bytes
        )
    })
}

/// What `pick` makes of the nodes of the plan's schedule, given each with its position, in
/// schedule order: the lists of the collectives.
fn in_schedule<T>(plan: &MemoryPlan, mut pick: impl FnMut(usize, NodeId) -> Option<T>) -> Vec<T> {
    (plan.liveness.order.iter().enumerate())
        .filter_map(|(position, &id)| pick(position, id))
        .collect()
}

/// `line` of each row, a line each; empty for no rows.
fn one_line_each<T>(rows: &[T], line: impl Fn(&T) -> String) -> String {
    rows.iter().map(|x| line(x) + "\n").collect()
}

/// One reduce-scatter in the plan: a bucket of gradients of which each rank keeps its rows of
/// the sum (the gradients of a sharded optimizer's weights).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Scatter {
    /// The reduce-scatter node.
    pub node: NodeId,
    pub ranks: usize,
    /// Gradients in the bucket.
    pub gradients: usize,
    /// Bytes this rank sends (its whole gradients) and keeps after it (its rows of the sum).
    pub bytes: usize,
    pub scattered_bytes: usize,
    /// Schedule position of the reduce-scatter.
    pub position: usize,
    /// The layer whose gradient completes the bucket (the provenance of its last operand).
    pub after: String,
}

/// The reduce-scatters of a planned step, in schedule order (none for an unsharded step).
pub fn scatters(g: &Graph, plan: &MemoryPlan) -> Vec<Scatter> {
    let outputs = g.kernel_outputs();
    in_schedule(plan, |position, id| {
        let Op::ReduceScatter { ranks } = g.node(id).op else {
            return None;
        };
        let inputs = &g.node(id).inputs;
        let last_operand = *inputs.iter().max()?;
        Some(Scatter {
            node: id,
            ranks,
            gradients: inputs.len(),
            bytes: inputs.iter().map(|&x| g.ty(x).bytes()).sum(),
            scattered_bytes: outputs[id.index()].iter().map(|&o| g.ty(o).bytes()).sum(),
            position,
            after: g.describe(g.writer(last_operand)),
        })
    })
}

/// The reduce-scatters, one line each; empty for a step without them.
pub fn scatter_table(scatters: &[Scatter]) -> String {
    one_line_each(scatters, |x| {
        format!(
            "reduce-scatter over {} ranks at position {}: {} gradient{} of {} bytes after {} ({} bytes kept a rank)",
            x.ranks,
            x.position,
            x.gradients,
            if x.gradients == 1 { "" } else { "s" },
            x.bytes,
            x.after,
            x.scattered_bytes
        )
    })
}
