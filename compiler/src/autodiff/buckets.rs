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
    let mut order: Vec<NodeId> = grads.to_vec();
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
    let mut reduced = std::collections::HashMap::new();
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
