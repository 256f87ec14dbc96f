//! The whole training step as one graph: forward, backward, optimizer update.

use super::optim::Optimizer;
use super::phase::Phases;
use crate::error::{IrError, Result};
use crate::ir::{Graph, LeafKind, NodeId, Op};

pub use super::names::{GRAD_NORM, LOSS};

/// A training step graph, with the node ranges of its three phases (for reports and benchmarks).
#[derive(Clone, Debug)]
pub struct Step {
    pub graph: Graph,
    pub phases: Phases,
}

impl Step {
    /// `graph` as a step that is a forward pass alone: no backward pass, no update.
    pub fn forward_only(graph: Graph) -> Step {
        let n = graph.len();
        Step {
            graph,
            phases: Phases::forward_only(n),
        }
    }
}

/// The name of the f64 scalar input that scales the learning rate ([`StepOptions::lr_scale`]).
pub const LR_SCALE: &str = "lr_scale";

/// What a training step computes besides the gradients and the optimizer's update. The
/// default adds nothing: the step is exactly [`training_step`]'s.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepOptions {
    /// Scale the learning rate by an f64 scalar input named [`LR_SCALE`], written by the host
    /// before each step (a schedule's factor, as `torch.optim.lr_scheduler.LambdaLR`): one
    /// compiled step serves the whole schedule.
    pub lr_scale: bool,
    /// Clip the gradients by their global L2 norm as `torch.nn.utils.clip_grad_norm_`:
    /// `g *= min(1, max / (norm + 1e-6))`, and output the norm (before clipping) as
    /// [`GRAD_NORM`].
    pub clip_grad_norm: Option<f64>,
    /// Read AdamW's step number (its bias corrections) from an f64 scalar input named
    /// [`super::optim::STEP_COUNTER`], written by the host before each step, instead of a
    /// counter kept as optimizer state: one compiled step serves the whole run, and a resumed
    /// run passes the right step. Other optimizers have no step number: no input is made.
    pub step_input: bool,
    /// Data parallelism over this many ranks: the gradients are averaged over the ranks by
    /// all-reduce ops in buckets ([`super::buckets`]) before clipping and the update. 0 (the
    /// default) and 1 mean one rank: no all-reduce, the single-device step exactly.
    pub ranks: usize,
    /// Gradient accumulation over this many micro-batches: the forward graph given is one
    /// micro-batch's; the step runs this many of them on their rows of a batch this many times
    /// larger, each forward pass followed by its backward pass, then one update
    /// ([`super::accumulate`]). 0 and 1: no accumulation.
    pub accumulate: usize,
    /// Compute and differentiate a large loss head (a language model's logits and
    /// cross-entropy) in row chunks whose largest value is at most this many bytes
    /// ([`super::chunk`]); 0 (the default): the head whole. Chunking lowers the peak by most
    /// of the head's largest tensor and costs an addition of the head's weight gradient per
    /// extra chunk ([`super::chunk::HEAD_CHUNK_BYTES`] is the CLI's choice).
    pub loss_head_chunk_bytes: usize,
    /// With `ranks >= 2`: a gradient computed in bf16 and widened to f32 for the update (a bf16
    /// matrix product's weight gradient) is all-reduced in bf16, before it is widened: half
    /// the bytes on the wire, the mean rounded to bf16 once (PyTorch DDP's
    /// `bf16_compress_hook`). Off by default: the f32 gradients are all-reduced.
    pub reduce_in_bf16: bool,
    /// With `ranks >= 2`: the all-reduce buckets' size in bytes (DDP's `bucket_cap_mb`);
    /// 0 (the default) is [`super::buckets::BUCKET_BYTES`], 25 MiB. Smaller buckets start
    /// their all-reduces earlier in the backward pass and leave a shorter one at its end, in
    /// more collectives.
    pub bucket_bytes: usize,
    /// Cast the weights to bf16 in every forward pass, as autocast does, instead of keeping
    /// bf16 copies that the update writes ([`super::copies`]). Off by default: a bf16 step
    /// keeps copies; the two compute the same numbers.
    pub cast_weights_each_step: bool,
    /// With `ranks >= 2` and bf16 weight copies: each rank keeps and updates only its rows of
    /// each copied weight and of its optimizer state, reduce-scatters those weights' gradients
    /// and all-gathers their new copies ([`super::shard`], ZeRO stage 1). Off by default.
    pub shard_optimizer: bool,
    /// Count the non-finite values of the parameters the update writes, as the f64 scalar
    /// output [`super::nonfinite::NONFINITE`], read with the loss each step: a finite loss
    /// whose update overflows the weights stops a run at that step. Off by default (the step
    /// is exactly [`training_step`]'s); the `ingot` program turns it on.
    pub count_nonfinite: bool,
}

/// Builds the training step of `forward` (which must name its scalar loss `"loss"`):
/// gradients of the loss with respect to every parameter, then `optimizer`'s in-place updates.
pub fn training_step(forward: &Graph, optimizer: &Optimizer) -> Result<Step> {
    training_step_with(forward, optimizer, &StepOptions::default())
}

/// As [`training_step`], with the learning-rate input and gradient clipping `opts` asks for.
pub fn training_step_with(
    forward: &Graph,
    optimizer: &Optimizer,
    opts: &StepOptions,
) -> Result<Step> {
    let loss = *forward.outputs.get(LOSS).ok_or_else(|| {
        IrError::Invalid(format!("the forward graph has no output named {LOSS:?}"))
    })?;
    // The forward pass may update state of its own (batch norm's running statistics); an
    // update of a parameter means the graph is a step already.
    if forward.updates.iter().any(|u| {
        matches!(
            forward.node(u.target).op,
            Op::Leaf {
                kind: LeafKind::Parameter,
                ..
            }
        )
    }) {
        return Err(IrError::Invalid(
            "the forward graph already updates parameters; is it a step already?".into(),
        ));
    }
    let (mut g, map) = forward.without_dead_code();
    let loss = map[loss.index()].expect("outputs survive dead-code removal");
    let params = g.leaves(LeafKind::Parameter);
    if params.is_empty() {
        return Err(IrError::Invalid(
            "the forward graph has no parameters to train".into(),
        ));
    }
    if !depends_on_a_parameter(&g, loss) {
        return Err(IrError::Invalid(format!(
            "the loss {loss} depends on no parameter, so no step can change it (as PyTorch says, it \"does not require grad\"); compute the loss from the model's parameters"
        )));
    }
    // As in PyTorch, a parameter the loss does not depend on gets no gradient and so no update:
    // no weight decay, no optimizer state (its value stays as loaded, and is still saved).
    let reaches = ancestors(&g, loss);
    let params: Vec<NodeId> = params.into_iter().filter(|p| reaches[p.index()]).collect();
    // A loss head computed in chunks leaves the whole head's nodes unread, and so does the
    // scaled loss of several ranks (only its gradient is read).
    let ranks = opts.ranks.max(1);
    let mut dead_code = ranks > 1;
    let (mut g, params, f, grads) = if opts.accumulate > 1 {
        if opts.loss_head_chunk_bytes > 0 {
            dead_code = true; // each micro-batch's head may be in chunks
        }
        let forward_nodes = g.len();
        let (step, _, params, grads) = super::accumulate::accumulated_gradients(
            &g,
            &params,
            opts.accumulate,
            opts.loss_head_chunk_bytes,
            ranks,
        )?;
        // The first micro-batch's forward pass (and the leaves) come first; the phases of an
        // accumulated step interleave after it.
        (step, params, forward_nodes, grads)
    } else {
        let f = g.len();
        // Each of several ranks differentiates its loss over `ranks` ([`rank_share`]), so
        // the sum its all-reduces take is the mean.
        let root = match ranks {
            1 => loss,
            _ => rank_share(&mut g, loss, ranks)?,
        };
        let chunked = super::chunk::grad_in_chunks(
            &mut g,
            root,
            &params,
            opts.loss_head_chunk_bytes,
            ranks as f64,
        )?;
        if chunked.chunks > 1 {
            g.outputs.insert(LOSS.to_string(), chunked.loss);
            dead_code = true;
        }
        (g, params, f, chunked.grads)
    };
    // The sum over the ranks of their gradients of their shares, the mean of their
    // gradients, is what every rank's optimizer (and clipping) reads.
    let mut grads = super::buckets::all_reduce_buckets(
        &mut g,
        &grads,
        opts.ranks,
        if opts.bucket_bytes == 0 {
            super::buckets::BUCKET_BYTES
        } else {
            opts.bucket_bytes
        },
        opts.reduce_in_bf16,
    )?;
    let b = g.len();
    if let Some(max) = opts.clip_grad_norm {
        if !(max.is_finite() && max > 0.0) {
            return Err(IrError::Invalid(format!(
                "the gradient clipping norm must be a finite number above 0, not {max}"
            )));
        }
        grads = clip_by_global_norm(&mut g, &grads, max)?;
    }
    let lr_scale = if opts.lr_scale {
        Some(g.input(LR_SCALE, crate::ir::Shape::scalar(), crate::ir::DType::F64)?)
    } else {
        None
    };
    let step = if opts.step_input && matches!(optimizer, Optimizer::AdamW { .. }) {
        Some(g.input(
            super::optim::STEP_COUNTER,
            crate::ir::Shape::scalar(),
            crate::ir::DType::F64,
        )?)
    } else {
        None
    };
    optimizer.apply_with_inputs(&mut g, &params, &grads, lr_scale, step)?;
    let n = g.len();
    name_updates(&mut g, b);
    let (g, [f, b, n]) = if dead_code {
        let (live, map) = g.without_dead_code();
        // Each phase boundary moves down by the dead nodes before it.
        let at = |i: usize| map[..i].iter().filter(|m| m.is_some()).count();
        (live, [at(f), at(b), at(n)])
    } else {
        (g, [f, b, n])
    };
    let phases = Phases {
        forward: 0..f,
        backward: f..b,
        optimizer: b..n,
    };
    let (graph, phases) = if opts.cast_weights_each_step {
        (g, phases)
    } else {
        super::copies::keep_weight_copies(g, phases)?
    };
    let (graph, phases) = if opts.shard_optimizer {
        super::shard::shard_optimizer(graph, phases, opts.ranks)?
    } else {
        (graph, phases)
    };
    // Last, so that it reads the values the update writes as the step finally writes them
    // (a sharded rank's rows).
    let (graph, phases) = if opts.count_nonfinite {
        super::nonfinite::count_nonfinite(graph, phases)?
    } else {
        (graph, phases)
    };
    Ok(Step { graph, phases })
}

/// Names the optimizer's nodes (those from `first` on) after the update they serve:
/// `update of blocks.3.qkv.weight` for a node only one parameter's update reads, `optimizer`
/// for one several share (AdamW's bias corrections); gradient clipping's nodes, which every
/// update reads, are `gradient clipping` when the step clips. Deterministic: updates in order.
/// A rank's share of the loss of `ranks` data-parallel ranks: its own loss over `ranks`, the
/// value whose gradients it computes. The step's loss is the mean of the ranks' losses, so
/// each rank's part of its gradient is the gradient of that share, and the ranks' gradients
/// are *summed* ([`Op::AllReduce`] is a sum), which NCCL's
/// symmetric-memory kernels run and its average does not (NCCL 2.28: `ncclAvg` of floats
/// is a pre-multiplied sum, which they do not implement). Scaling the seed scales every
/// gradient exactly when `ranks` is a power of two (a float times 2^-k is exact short of
/// the subnormals), so two ranks' sum is, bit for bit, the average of their gradients. Only
/// the share's gradient is read: the node itself is dead and removed.
pub fn rank_share(g: &mut Graph, loss: NodeId, ranks: usize) -> Result<NodeId> {
    g.mul_scalar(loss, 1.0 / ranks as f64)
}

fn name_updates(g: &mut Graph, first: usize) {
    use crate::ir::Origin;
    let n = g.len();
    // For each node from `first`, the update that reaches it first, and whether several do.
    let mut owner: Vec<Option<usize>> = vec![None; n];
    let mut shared = vec![false; n];
    for (k, u) in g.updates.iter().enumerate() {
        let mut stack = vec![u.value];
        let mut seen = std::collections::HashSet::new();
        while let Some(x) = stack.pop() {
            if x.index() < first || !seen.insert(x) {
                continue;
            }
            match owner[x.index()] {
                None => owner[x.index()] = Some(k),
                Some(o) if o != k => shared[x.index()] = true,
                _ => {}
            }
            stack.extend(g.node(x).inputs.iter().copied());
        }
    }
    let clip = g.outputs.get(GRAD_NORM).copied();
    for i in first..n {
        let id = NodeId(i as u32);
        if g.node(id).op.is_leaf() && g.origin(id).primary().is_some() {
            continue;
        }
        let origin = match (owner[i], shared[i]) {
            _ if clip.is_some_and(|c| i <= c.index()) => Origin::new("gradient clipping"),
            (Some(_), true) => Origin::new("optimizer"),
            (Some(k), false) => {
                let target = g.updates[k].target;
                Origin::new(&format!(
                    "update of {}",
                    g.leaf_name(target).unwrap_or("a parameter")
                ))
            }
            (None, _) => Origin::new("optimizer"),
        };
        g.set_origin(id, origin);
    }
}

/// The gradients scaled by `min(1, max / (norm + 1e-6))`, `norm` their global L2 norm (each
/// tensor's sum of squares in its dtype, added in f64), output as [`GRAD_NORM`].
fn clip_by_global_norm(g: &mut Graph, grads: &[NodeId], max: f64) -> Result<Vec<NodeId>> {
    let mut total = None;
    for &gr in grads {
        let sq = g.mul(gr, gr)?;
        let s = g.sum_all(sq)?;
        let s = g.convert(s, crate::ir::DType::F64)?;
        total = Some(match total {
            None => s,
            Some(t) => g.add(t, s)?,
        });
    }
    let total = total.ok_or_else(|| IrError::Invalid("no gradients to clip".into()))?;
    let norm = g.sqrt(total)?;
    g.set_output(GRAD_NORM, norm)?;
    let denom = g.add_scalar(norm, 1e-6)?;
    let k = g.full(max, crate::ir::Shape::scalar(), crate::ir::DType::F64)?;
    let coef = g.div(k, denom)?;
    let one = g.full(1.0, crate::ir::Shape::scalar(), crate::ir::DType::F64)?;
    let coef = g.minimum(coef, one)?;
    let mut out = Vec::with_capacity(grads.len());
    let mut by_dtype: Vec<(crate::ir::DType, NodeId)> = Vec::new();
    for &gr in grads {
        let dt = g.ty(gr).dtype;
        let c = match by_dtype.iter().find(|x| x.0 == dt) {
            Some(&(_, c)) => c,
            None => {
                let c = g.convert(coef, dt)?;
                by_dtype.push((dt, c));
                c
            }
        };
        out.push(g.mul(gr, c)?);
    }
    Ok(out)
}

/// `out[i]` is true when `x` depends on node `i` (or is it). One backward sweep over the
/// topological node list.
fn ancestors(g: &Graph, x: NodeId) -> Vec<bool> {
    let mut reaches = vec![false; x.index() + 1];
    reaches[x.index()] = true;
    for id in g
        .ids()
        .take(x.index() + 1)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        if reaches[id.index()] {
            for i in &g.node(id).inputs {
                reaches[i.index()] = true;
            }
        }
    }
    reaches.resize(g.len(), false);
    reaches
}

/// True when some parameter reaches `x` through the graph's operands. The node list is a
/// topological order, so one forward sweep decides it for every node.
fn depends_on_a_parameter(g: &Graph, x: NodeId) -> bool {
    let mut depends = vec![false; x.index() + 1];
    for id in g.ids().take(x.index() + 1) {
        let node = g.node(id);
        depends[id.index()] = matches!(
            node.op,
            Op::Leaf {
                kind: LeafKind::Parameter,
                ..
            }
        ) || node.inputs.iter().any(|i| depends[i.index()]);
    }
    depends[x.index()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::parse;

    /// `v` feeds an output but not the loss.
    const UNREACHED: &str = r#"ingot-ir 1
%0 = parameter "w" init=normal(0.5) : f32[2,2]
%1 = parameter "v" init=normal(0.5) : f32[2,2]
%2 = input "x" : f32[4,2]
%3 = matmul(%2, %0) : f32[4,2]
%4 = mul(%3, %3) : f32[4,2]
%5 = reduce_sum(%4) axes=[0,1] : f32[1,1]
%6 = reshape(%5) : f32[]
%7 = matmul(%2, %1) : f32[4,2]
output "loss" = %6
output "other" = %7
"#;

    #[test]
    fn a_parameter_the_loss_does_not_reach_gets_no_update_and_no_optimizer_state() {
        let forward = parse(UNREACHED).unwrap();
        let step = training_step(&forward, &Optimizer::adamw(1e-3, 0.1)).unwrap();
        let g = &step.graph;
        let name = |id: NodeId| match &g.node(id).op {
            Op::Leaf { name, .. } => name.clone(),
            op => panic!("an update of a non-leaf {op:?}"),
        };
        let mut targets: Vec<String> = g.updates.iter().map(|u| name(u.target)).collect();
        targets.sort();
        assert_eq!(
            targets,
            [
                super::super::optim::STEP_COUNTER,
                "w",
                "w.exp_avg",
                "w.exp_avg_sq"
            ],
            "only w, its moments and the step counter are updated"
        );
        let mut state: Vec<String> = g.leaves(LeafKind::State).into_iter().map(name).collect();
        state.sort();
        assert_eq!(
            state,
            [
                super::super::optim::STEP_COUNTER,
                "w.exp_avg",
                "w.exp_avg_sq"
            ],
            "v has no optimizer state"
        );
    }
}
