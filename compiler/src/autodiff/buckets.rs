//! Data parallelism's gradient buckets: with `ranks >= 2`, the gradients are averaged over the
//! ranks by all-reduce ops ([`Op::AllReduce`]) before the optimizer reads them, as PyTorch's
//! `DistributedDataParallel` does. Each rank's gradients are of its share of the loss (its
//! loss over `ranks`, [`super::step::rank_share`]), so the all-reduce is a sum.
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
//! gradient itself (of every rank's share of the loss, so the mean). Every rank adds the same rows in the same
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
/// `in_bf16` ([`super::StepOptions::reduce_in_bf16`]), what a bf16 computation made crosses
/// between the ranks in bf16: a gradient that is a bf16 value widened to f32 is averaged as
/// that bf16 value, and an f32 operand of a gathered sum (an embedding's rows: the gradient of
/// a bf16 model's residual stream) is gathered in bf16; each is back in f32 after (the mean
/// widened, the rows summed in f32 by the sum that reads them).
/// A gradient computed in f32 (a bias's column sum) is all-reduced in f32: narrowing it would
/// cost a kernel of its own per gradient, as the sum's kernel cannot store it narrowed.
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
            if let Some(y) = gathered(g, x, ranks, in_bf16, &mut sent)? {
                averaged.insert(x, y);
                more = true;
            }
        }
        if !more {
            break;
        }
    }
    // What each bucketed gradient is all-reduced as: in bf16, the bf16 value it widens.
    let mut sent_as = std::collections::HashMap::new();
    for &x in grads {
        if averaged.contains_key(&x) || sent_as.contains_key(&x) {
            continue;
        }
        let n = match in_bf16 {
            true => bf16_source(g, x)?.unwrap_or(x),
            false => x,
        };
        sent_as.insert(x, n);
    }
    // Buckets fill in the order the backward pass produces the gradients (their node order),
    // not the order of the values sent (a narrowing is a node made after all of them).
    let mut order: Vec<(NodeId, NodeId)> = sent_as.iter().map(|(&x, &n)| (x, n)).collect();
    order.sort();
    let mut seen = std::collections::HashSet::new();
    let order: Vec<NodeId> = order
        .into_iter()
        .map(|(_, n)| n)
        .filter(|&n| seen.insert(n))
        .collect();
    // One bucket open per dtype (a collective has one). A full one closes, and the other
    // dtypes' open buckets close with it: a few small f32 gradients (biases, LayerNorm gains)
    // made beside bf16 ones would otherwise share one bucket over the whole backward pass, all
    // reduced, and all updated, after it. The buckets are then numbered by when their last
    // gradient is made.
    let mut buckets: Vec<Vec<NodeId>> = Vec::new();
    let mut open: Vec<(crate::ir::DType, Vec<NodeId>, usize)> = Vec::new();
    for &x in &order {
        let (dtype, b) = (g.ty(x).dtype, g.ty(x).bytes());
        let full = open
            .iter()
            .any(|o| o.0 == dtype && !o.1.is_empty() && o.2.saturating_add(b) > cap);
        if full {
            for o in &mut open {
                if !o.1.is_empty() {
                    buckets.push(std::mem::take(&mut o.1));
                    o.2 = 0;
                }
            }
        }
        let k = match open.iter().position(|o| o.0 == dtype) {
            Some(k) => k,
            None => {
                open.push((dtype, Vec::new(), 0));
                open.len() - 1
            }
        };
        open[k].1.push(x);
        open[k].2 += b;
    }
    buckets.extend(open.into_iter().map(|o| o.1).filter(|b| !b.is_empty()));
    let rank_of: std::collections::HashMap<NodeId, usize> =
        order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    buckets.sort_by_key(|b| b.last().map(|n| rank_of[n]));
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
    // Each mean widened back to its gradient's type, once per mean.
    let mut widened = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(grads.len());
    for &x in grads {
        if let Some(&y) = averaged.get(&x) {
            out.push(y);
            continue;
        }
        let mean = reduced[&sent_as[&x]];
        if g.ty(mean).dtype == g.ty(x).dtype {
            out.push(mean);
            continue;
        }
        let w = match widened.get(&mean) {
            Some(&w) => w,
            None => {
                let w = widen(g, mean, g.ty(x).clone(), x)?;
                widened.insert(mean, w);
                w
            }
        };
        out.push(w);
    }
    Ok(out)
}

/// `x` (an f32 value) narrowed to bf16 for the wire, with `x`'s origin; other types unchanged.
fn narrowed(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    if g.ty(x).dtype != crate::ir::DType::F32 {
        return Ok(x);
    }
    let mut ty = g.ty(x).clone();
    ty.dtype = crate::ir::DType::BF16;
    g.with_origin(g.origin(x).clone(), |g| g.push(Op::Convert, &[x], Some(ty)))
}

/// `v` converted to `ty` (a bf16 mean or gathered value back to f32), with `like`'s origin.
fn widen(g: &mut Graph, v: NodeId, ty: crate::ir::TensorType, like: NodeId) -> Result<NodeId> {
    g.with_origin(g.origin(like).clone(), |g| {
        g.push(Op::Convert, &[v], Some(ty))
    })
}

/// An operand gathered from every rank: the all-gather's result (bf16 where the operand was
/// narrowed for the wire) and, once a sum reads it in the operand's own type, its widening.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    all: NodeId,
    widened: Option<NodeId>,
}

/// The mean over the ranks of gradient `x`, computed on every rank from its operands gathered
/// from all ranks, when `x` is a sum over its operands' rows (a `scatter_add`, or a
/// `reduce_sum` whose axes include 0, possibly reshaped) and that is the cheaper collective;
/// `None` otherwise (the gradient goes into a bucket). `sent` maps each operand gathered so far to its all-gather,
/// which later gradients reuse at no cost.
///
/// Cheaper is counted in bytes each rank receives: an all-gather of operands of `b` bytes a
/// rank receives `(ranks - 1) * b`; a ring all-reduce of `n` bytes,
/// `2 * (ranks - 1) / ranks * n`. So the operands are gathered when `ranks * b < 2 * n`, `b`
/// counting only operands not gathered yet, as sent. The op then runs over `ranks` times the
/// rows (on gpt2, the embedding's `scatter_add` over 16,384 positions instead of 8,192). With
/// `in_bf16`, an f32 operand is sent as bf16 (half the bytes): a `scatter_add` reads the bf16
/// rows and sums them in f32 into its f32 result, other sums read them widened back.
pub fn gathered(
    g: &mut Graph,
    x: NodeId,
    ranks: usize,
    in_bf16: bool,
    sent: &mut std::collections::HashMap<NodeId, Sent>,
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
    let wire_bytes = |g: &Graph, i: NodeId| match (in_bf16, g.ty(i).dtype) {
        (true, crate::ir::DType::F32) => g.ty(i).bytes() / 2,
        _ => g.ty(i).bytes(),
    };
    let new_bytes: usize = node
        .inputs
        .iter()
        .filter(|i| !sent.contains_key(i))
        .map(|&i| wire_bytes(g, i))
        .sum();
    if new_bytes.saturating_mul(ranks) >= node.ty.bytes().saturating_mul(2) {
        return Ok(None);
    }
    let origin = g.origin(x).clone();
    g.with_origin(origin.clone(), |g| {
        let scope = format!("all-gather for {origin}");
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for (i, &v) in node.inputs.iter().enumerate() {
            let mut s = match sent.get(&v) {
                Some(&s) => s,
                None => g.scoped(&scope, |g| -> Result<Sent> {
                    let wire = if in_bf16 { narrowed(g, v)? } else { v };
                    let all = g.push(Op::AllGather { ranks }, &[wire], None)?;
                    Ok(Sent { all, widened: None })
                })?,
            };
            let narrow = g.ty(s.all).dtype != g.ty(v).dtype;
            // A scatter-add sums bf16 rows into its f32 result itself; other sums read them
            // widened back (a convert their kernel fuses).
            let summed_wide = matches!(node.op, Op::ScatterAdd { .. })
                && i == 1
                && g.ty(s.all).dtype == crate::ir::DType::BF16
                && node.ty.dtype == crate::ir::DType::F32;
            let input = match (narrow && !summed_wide, s.widened) {
                (false, _) => s.all,
                (true, Some(w)) => w,
                (true, None) => {
                    let mut ty = g.ty(s.all).clone();
                    ty.dtype = g.ty(v).dtype;
                    let w = g.scoped(&scope, |g| g.push(Op::Convert, &[s.all], Some(ty)))?;
                    s.widened = Some(w);
                    w
                }
            };
            sent.insert(v, s);
            inputs.push(input);
        }
        let mut sum = g.push(node.op.clone(), &inputs, Some(node.ty.clone()))?;
        for ty in reshapes.iter().rev() {
            sum = g.push(Op::Reshape, &[sum], Some(ty.clone()))?;
        }
        // Every rank's rows are of its share of the loss ([`super::step::rank_share`]):
        // their sum is the mean.
        Ok(Some(sum))
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
