//! Gradient accumulation: the step runs `k` micro-batches, each the forward pass of one
//! micro-batch on its own rows of the batch inputs followed at once by its backward pass, sums
//! their gradients, and updates once. For a mean loss over equal micro-batches this is the
//! full batch's step (`(1/k) Σ ∇ loss_i` is the gradient of the mean of the micro-batch losses),
//! in about the activation memory of one micro-batch: each micro-batch's backward pass is
//! built (autodiff of that micro-batch's loss alone) right after its forward pass, so the step's
//! node order runs them one after another, and a micro-batch's activations die before the next
//! one's are made.
//!
//! What the copies share and what each owns:
//! - parameters and scalar inputs (the learning-rate scale, dropout's seed) are the one leaf;
//! - a batch input (every input of rank one or more, the batch along axis 0) becomes one leaf
//!   `k` times larger, and copy `i` reads rows `[i b, (i + 1) b)`;
//! - state the forward pass updates (batch norm's running statistics) is threaded through the
//!   copies in order, as `k` forward passes of a PyTorch accumulation loop update it `k` times
//!   (and, as there, batch norm normalises each micro-batch by its own statistics, so a model
//!   with batch norm is not the full batch's step);
//! - dropout draws fresh masks in each copy (its salt is mixed with the copy's number).

use super::names::LOSS;
use crate::error::{IrError, Result};
use crate::ir::{Graph, LeafKind, NodeId, Op};

pub use super::names::ACCUMULATION;

/// The name of micro-batch `i`'s loss among the step's outputs (`loss/0`, `loss/1`, ...): where
/// its forward pass ends, for the passes that tell forward from backward by the loss
/// (fusion's recomputation for the backward pass).
pub fn micro_batch_loss(i: usize) -> String {
    format!("{LOSS}/{i}")
}

/// Whether `name` is a micro-batch loss's output name.
pub fn is_micro_batch_loss(name: &str) -> bool {
    name.strip_prefix(LOSS)
        .and_then(|r| r.strip_prefix('/'))
        .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
}

/// The forward pass of one micro-batch, and the leaves of the accumulated step it is copied into.
pub struct MicroBatches<'f> {
    forward: &'f Graph,
    /// The step's leaf for each leaf of `forward` (a batch input k times larger).
    leaf: Vec<Option<NodeId>>,
    batched: Vec<bool>,
    /// The value each state leaf holds before the next copy reads it.
    current: Vec<Option<NodeId>>,
}

impl<'f> MicroBatches<'f> {
    /// Makes the step's leaves in `g` (empty): `forward`'s, with each batch input `k` times
    /// larger along axis 0.
    pub fn new(g: &mut Graph, forward: &'f Graph, k: usize) -> Result<MicroBatches<'f>> {
        let n = forward.len();
        g.set_mode(forward.mode());
        let mut leaf = vec![None; n];
        let mut batched = vec![false; n];
        for id in forward.ids() {
            let node = forward.node(id);
            let Op::Leaf { kind, name, .. } = &node.op else {
                continue;
            };
            let mut ty = node.ty.clone();
            if *kind == LeafKind::Input && !ty.shape.dims().is_empty() {
                let mut dims = ty.shape.dims().to_vec();
                dims[0] = dims[0].checked_mul(k).ok_or_else(|| {
                    IrError::Invalid(format!(
                        "input {name:?}: {k} micro-batches overflow its size"
                    ))
                })?;
                ty.shape = crate::ir::Shape::new(&dims);
                batched[id.index()] = true;
            }
            let new = g.push(node.op.clone(), &[], Some(ty))?;
            g.set_origin(new, forward.origin(id).clone());
            leaf[id.index()] = Some(new);
        }
        Ok(MicroBatches {
            forward,
            current: leaf.clone(),
            leaf,
            batched,
        })
    }

    /// Copies the forward pass of micro-batch `i` into `g`; returns its loss.
    pub fn forward(&mut self, g: &mut Graph, i: usize) -> Result<NodeId> {
        let f = self.forward;
        let loss = *f.outputs.get(LOSS).ok_or_else(|| {
            IrError::Invalid(format!("the forward graph has no output named {LOSS:?}"))
        })?;
        let mut map: Vec<Option<NodeId>> = vec![None; f.len()];
        for id in f.ids() {
            let node = f.node(id);
            let origin = f.origin(id).clone();
            let new = match &node.op {
                Op::Leaf { kind, .. } => match kind {
                    LeafKind::Input if self.batched[id.index()] => {
                        let b = node.ty.shape.dims()[0];
                        let whole = self.leaf[id.index()].expect("leaves made first");
                        let rows = g.slice(whole, 0, i * b, (i + 1) * b)?;
                        g.set_origin(rows, origin);
                        rows
                    }
                    LeafKind::State => self.current[id.index()].expect("leaves made first"),
                    _ => self.leaf[id.index()].expect("leaves made first"),
                },
                op => {
                    let op = match op {
                        Op::Dropout { p, salt } => Op::Dropout {
                            p: *p,
                            salt: salt.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                        },
                        op => op.clone(),
                    };
                    let inputs: Vec<NodeId> = node
                        .inputs
                        .iter()
                        .map(|x| map[x.index()].expect("operands come first"))
                        .collect();
                    let new = g.push(op, &inputs, Some(node.ty.clone()))?;
                    g.set_origin(new, origin);
                    new
                }
            };
            map[id.index()] = Some(new);
        }
        for u in &f.updates {
            self.current[u.target.index()] = map[u.value.index()];
        }
        Ok(map[loss.index()].expect("the loss is a node"))
    }

    /// The step's leaf standing for `forward`'s leaf `id`.
    pub fn leaf(&self, id: NodeId) -> Option<NodeId> {
        self.leaf.get(id.index()).copied().flatten()
    }

    /// After the last copy: the forward pass's state updates, from the last copy's values.
    pub fn finish_updates(&self, g: &mut Graph) -> Result<()> {
        for u in &self.forward.updates {
            let target = self.leaf[u.target.index()].expect("an update targets a leaf");
            let value = self.current[u.target.index()].expect("threaded through the copies");
            g.set_update(target, value)?;
        }
        Ok(())
    }
}

/// The accumulated forward and backward passes of `k` micro-batches of `forward` (one
/// micro-batch, its parameters `params` of `forward`): returns the step graph so far, its mean
/// loss (also its output [`LOSS`]) and the gradient of that mean loss for each parameter (in
/// `params`' order, as leaves of the new graph).
/// With `loss_head_chunk_bytes` above 0, each micro-batch's loss head runs in row chunks
/// ([`super::chunk`]) as a whole step's would.
pub fn accumulated_gradients(
    forward: &Graph,
    params: &[NodeId],
    k: usize,
    loss_head_chunk_bytes: usize,
    ranks: usize,
) -> Result<(Graph, NodeId, Vec<NodeId>, Vec<NodeId>)> {
    let mut g = Graph::new();
    let mut mb = MicroBatches::new(&mut g, forward, k)?;
    let new_params: Vec<NodeId> = params
        .iter()
        .map(|&p| mb.leaf(p).expect("a parameter is a leaf"))
        .collect();
    let scale = 1.0 / k as f64;
    let mut sum: Option<Vec<NodeId>> = None;
    let mut losses = Vec::with_capacity(k);
    for i in 0..k {
        let loss = mb.forward(&mut g, i)?;
        // Each rank of several differentiates its share of the mean over the ranks too
        // ([`super::step::rank_share`]).
        let share = scale / ranks.max(1) as f64;
        let part = g.scoped(&format!("micro-batch {i}"), |g| g.mul_scalar(loss, share))?;
        let chunked = super::chunk::grad_in_chunks(
            &mut g,
            part,
            &new_params,
            loss_head_chunk_bytes,
            (k * ranks.max(1)) as f64,
        )?;
        let grads = chunked.grads;
        // A head in chunks sums the loss anew (the whole head's nodes are dead).
        let loss = if chunked.chunks > 1 {
            chunked.loss
        } else {
            loss
        };
        g.set_output(&micro_batch_loss(i), loss)?;
        losses.push(loss);
        sum = Some(match sum {
            None => grads,
            Some(acc) => acc
                .iter()
                .zip(&grads)
                .map(|(&a, &b)| g.scoped(ACCUMULATION, |g| g.add(a, b)))
                .collect::<Result<Vec<_>>>()?,
        });
    }
    let mut total = losses[0];
    for &l in &losses[1..] {
        total = g.add(total, l)?;
    }
    let mean = g.mul_scalar(total, scale)?;
    g.set_output(LOSS, mean)?;
    mb.finish_updates(&mut g)?;
    Ok((g, mean, new_params, sum.expect("k >= 1")))
}
