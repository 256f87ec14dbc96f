//! Data parallelism's gradient buckets: with `ranks >= 2`, the gradients are averaged over the
//! ranks by all-reduce ops ([`Op::AllReduce`]) before the optimizer reads them, as PyTorch's
//! `DistributedDataParallel` does.
//!
//! Gradients are grouped, in the order the backward pass produces them (node order), into
//! buckets of about [`BUCKET_BYTES`] (DDP's `bucket_cap_mb = 25`), one dtype per bucket. Each
//! bucket is one all-reduce node whose outputs the optimizer reads; the planner writes each
//! output over its gradient and lays a bucket's outputs out adjacently, so the collective runs
//! on one contiguous region with no copy, and the schedule runs it as soon as its last gradient
//! exists (`schedule::hoist_collectives`), overlapping the rest of the backward pass on a
//! device that runs it on a stream of its own.
//!
//! A gradient made by a `scatter_add` (an embedding's) is the one exception: a sum over its
//! rows' positions, so the ranks' gradients summed are the `scatter_add` of every rank's ids and
//! rows concatenated. Where those operands are fewer bytes than the gradient ([`gathered`]: an
//! embedding table's gradient is `[vocab, dim]`, its operands `[tokens, dim]`), each rank
//! all-gathers them ([`Op::AllGather`]) and computes the summed gradient itself, then scales
//! it by `1 / ranks`. Every rank adds the same rows in the same order (rank 0's positions
//! first), so all hold the same bits, and they equal one device's gradient over the ranks'
//! batches concatenated. For gpt2 on two ranks this sends 25 MiB instead of all-reducing
//! 147 MiB, and the collective no longer waits for the last kernel of the backward pass.
//!
//! With one rank nothing is added: the step is exactly the single-device step.

use crate::error::Result;
use crate::ir::{Graph, NodeId, Op};

/// PyTorch DDP's default bucket size (`bucket_cap_mb = 25`, in MiB).
pub const BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// Averages `grads` (one per parameter, in parameter order; several parameters may share a
/// gradient node) over `ranks` ranks in buckets of at most `cap` bytes (a gradient larger than
/// `cap` is a bucket of its own). Returns the averaged gradient of each parameter, in the same
/// order. One rank (or zero, the default) returns `grads` unchanged and adds no node.
pub fn all_reduce_buckets(
    g: &mut Graph,
    grads: &[NodeId],
    ranks: usize,
    cap: usize,
) -> Result<Vec<NodeId>> {
    if ranks <= 1 {
        return Ok(grads.to_vec());
    }
    let mut averaged = std::collections::HashMap::new();
    for &x in grads {
        if let Some(y) = gathered(g, x, ranks)? {
            averaged.insert(x, y);
        }
    }
    let mut order: Vec<NodeId> = grads
        .iter()
        .copied()
        .filter(|x| !averaged.contains_key(x))
        .collect();
    order.sort();
    order.dedup();
    let mut buckets: Vec<Vec<NodeId>> = Vec::new();
    let mut bytes = 0usize;
    for &x in &order {
        let b = g.ty(x).bytes();
        let fits = buckets.last().is_some_and(|last| {
            g.ty(last[0]).dtype == g.ty(x).dtype && bytes.saturating_add(b) <= cap
        });
        if fits {
            buckets.last_mut().expect("checked").push(x);
            bytes += b;
        } else {
            buckets.push(vec![x]);
            bytes = b;
        }
    }
    let mut reduced = averaged;
    for (k, bucket) in buckets.iter().enumerate() {
        g.scoped(&format!("all-reduce bucket {k}"), |g| -> Result<()> {
            let node = g.push(Op::AllReduce { ranks }, bucket, None)?;
            reduced.insert(bucket[0], node);
            for (i, &x) in bucket.iter().enumerate().skip(1) {
                let ty = g.ty(x).clone();
                reduced.insert(x, g.push(Op::Result { index: i }, &[node], Some(ty))?);
            }
            Ok(())
        })?;
    }
    Ok(grads.iter().map(|x| reduced[x]).collect())
}

/// The mean over the ranks of gradient `x`, computed on every rank from its operands gathered
/// from all ranks, when `x` is a `scatter_add` and that is the cheaper collective; `None`
/// otherwise (the gradient goes into a bucket).
///
/// Cheaper is counted in bytes each rank receives: an all-gather of operands of `b` bytes a
/// rank receives `(ranks - 1) * b`; a ring all-reduce of `n` bytes, `2 * (ranks - 1) / ranks
/// * n`. So the operands are gathered when `ranks * b < 2 * n`. The `scatter_add` then runs
/// over `ranks` times the positions (on gpt2, 16,384 instead of 8,192 ids; the step's other
/// kernels do not change).
pub fn gathered(g: &mut Graph, x: NodeId, ranks: usize) -> Result<Option<NodeId>> {
    let node = g.node(x).clone();
    let Op::ScatterAdd { rows } = node.op else {
        return Ok(None);
    };
    let operand_bytes: usize = node.inputs.iter().map(|&i| g.ty(i).bytes()).sum();
    let gradient_bytes = node.ty.bytes();
    if operand_bytes.saturating_mul(ranks) >= gradient_bytes.saturating_mul(2) {
        return Ok(None);
    }
    let origin = g.origin(x).clone();
    let prev = g.set_scope(origin.clone());
    let out = (|| {
        let gather = |g: &mut Graph, v: NodeId| {
            g.scoped(&format!("all-gather for {origin}"), |g| {
                g.push(Op::AllGather { ranks }, &[v], None)
            })
        };
        let ids = gather(g, node.inputs[0])?;
        let values = gather(g, node.inputs[1])?;
        let sum = g.scatter_add(ids, values, rows)?;
        g.mul_scalar(sum, 1.0 / ranks as f64)
    })();
    g.set_scope(prev);
    out.map(Some)
}
