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
//! A gradient made by a sum over the rows of its operands is the exception: a `scatter_add`
//! (an embedding's gradient adds rows by their ids) or a `reduce_sum` over axis 0. The ranks'
//! gradients summed are then the same op on every rank's operands concatenated along axis 0.
//! Where those operands are fewer bytes than the gradient ([`gathered`]: an embedding table's
//! gradient is `[vocab, dim]`, its operands `[tokens, dim]`), or are gathered already for
//! another gradient, each rank all-gathers them ([`Op::AllGather`]) and computes the summed
//! gradient itself, then scales it by `1 / ranks`. Every rank adds the same rows in the same
//! order (rank 0's positions first), so all hold the same bits, and they equal one device's
//! gradient over the ranks' batches concatenated. For gpt2 on two ranks this sends 25 MiB instead of all-reducing
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
/// order. One rank (or zero, the default) returns `grads` unchanged and adds no node. With
/// `in_bf16`, a gradient that is a bf16 value widened to f32 is averaged as that bf16 value
/// and widened after ([`super::StepOptions::reduce_in_bf16`]).
pub fn all_reduce_buckets(
    g: &mut Graph,
    grads: &[NodeId],
    ranks: usize,
    cap: usize,
    in_bf16: bool,
) -> Result<Vec<NodeId>> {
    if ranks <= 1 {
        return Ok(grads.to_vec());
    }
    if in_bf16 {
        // Average the bf16 values, then widen the means as the gradients were widened.
        let mut narrow = Vec::with_capacity(grads.len());
        for &x in grads {
            narrow.push(bf16_source(g, x)?.unwrap_or(x));
        }
        let means = all_reduce_buckets(g, &narrow, ranks, cap, false)?;
        let mut widened = std::collections::HashMap::new();
        let mut out = Vec::with_capacity(grads.len());
        for ((&x, &n), mean) in grads.iter().zip(&narrow).zip(means) {
            if n == x {
                out.push(mean);
                continue;
            }
            let w = match widened.get(&mean) {
                Some(&w) => w,
                None => {
                    let ty = g.ty(x).clone();
                    let w = g.with_origin(g.origin(x).clone(), |g| {
                        g.push(Op::Convert, &[mean], Some(ty))
                    })?;
                    widened.insert(mean, w);
                    w
                }
            };
            out.push(w);
        }
        return Ok(out);
    }
    // Gradients made from gathered operands; a pass may make an operand gathered that makes
    // another gradient free to gather (the embeddings' gradients read the same rows), so the
    // passes go on until one gathers nothing new.
    let mut averaged = std::collections::HashMap::new();
    let mut sent = std::collections::HashMap::new();
    loop {
        let mut more = false;
        for &x in grads {
            if averaged.contains_key(&x) {
                continue;
            }
            if let Some(y) = gathered(g, x, ranks, &mut sent)? {
                averaged.insert(x, y);
                more = true;
            }
        }
        if !more {
            break;
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
/// from all ranks, when `x` is a sum over its operands' rows (a `scatter_add`, or a
/// `reduce_sum` whose axes include 0, possibly reshaped) and that is the cheaper collective;
/// `None` otherwise (the gradient goes into a bucket). `sent` maps each operand gathered so far to its all-gather,
/// which later gradients reuse at no cost.
///
/// Cheaper is counted in bytes each rank receives: an all-gather of operands of `b` bytes a
/// rank receives `(ranks - 1) * b`; a ring all-reduce of `n` bytes, `2 * (ranks - 1) / ranks
/// * n`. So the operands are gathered when `ranks * b < 2 * n`, `b` counting only operands not
/// gathered yet. The op then runs over `ranks` times the rows (on gpt2, the embedding's
/// `scatter_add` over 16,384 positions instead of 8,192).
pub fn gathered(
    g: &mut Graph,
    x: NodeId,
    ranks: usize,
    sent: &mut std::collections::HashMap<NodeId, NodeId>,
) -> Result<Option<NodeId>> {
    // Reshapes of the sum (a broadcast parameter's gradient, `[1, T, d]` read as `[T, d]`)
    // are made again on top of the gathered sum, whose type is the sum's.
    let mut reshapes = Vec::new();
    let mut core = x;
    while let Op::Reshape = g.node(core).op {
        reshapes.push(g.ty(core).clone());
        core = g.node(core).inputs[0];
    }
    let node = g.node(core).clone();
    let sums_rows = match &node.op {
        Op::ScatterAdd { .. } => true,
        Op::Reduce {
            op: crate::ir::ReduceOp::Sum,
            axes,
        } => axes.contains(&0),
        _ => false,
    };
    if !sums_rows {
        return Ok(None);
    }
    let new_bytes: usize = node
        .inputs
        .iter()
        .filter(|i| !sent.contains_key(i))
        .map(|&i| g.ty(i).bytes())
        .sum();
    if new_bytes.saturating_mul(ranks) >= node.ty.bytes().saturating_mul(2) {
        return Ok(None);
    }
    let origin = g.origin(x).clone();
    g.with_origin(origin.clone(), |g| {
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &v in &node.inputs {
            let all = match sent.get(&v) {
                Some(&all) => all,
                None => g.scoped(&format!("all-gather for {origin}"), |g| {
                    g.push(Op::AllGather { ranks }, &[v], None)
                })?,
            };
            sent.insert(v, all);
            inputs.push(all);
        }
        let mut sum = g.push(node.op.clone(), &inputs, Some(node.ty.clone()))?;
        for ty in reshapes.iter().rev() {
            sum = g.push(Op::Reshape, &[sum], Some(ty.clone()))?;
        }
        g.mul_scalar(sum, 1.0 / ranks as f64).map(Some)
    })
}

/// The bf16 value an f32 gradient widens, when it is one: `convert` of a bf16 operand, seen
/// through the reshapes and transposes above it (a weight gradient is the transpose of a
/// widened product), which are made again over the bf16 value (they commute with the cast).
fn bf16_source(g: &mut Graph, x: NodeId) -> Result<Option<NodeId>> {
    let mut views = Vec::new();
    let mut v = x;
    while matches!(g.node(v).op, Op::Reshape | Op::Transpose { .. }) {
        views.push(v);
        v = g.node(v).inputs[0];
    }
    let n = g.node(v);
    let &[y] = n.inputs.as_slice() else {
        return Ok(None);
    };
    if !(matches!(n.op, Op::Convert)
        && n.ty.dtype == crate::ir::DType::F32
        && g.ty(y).dtype == crate::ir::DType::BF16)
    {
        return Ok(None);
    }
    let mut cur = y;
    for &w in views.iter().rev() {
        let (op, mut ty) = (g.node(w).op.clone(), g.ty(w).clone());
        ty.dtype = crate::ir::DType::BF16;
        cur = g.with_origin(g.origin(w).clone(), |g| g.push(op, &[cur], Some(ty)))?;
    }
    Ok(Some(cur))
}
