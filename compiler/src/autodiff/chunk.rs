//! The loss head in row chunks: a loss that sums a row-wise computation over the `N` rows of a
//! large matrix product (a language model's `[tokens, vocab]` logits, their softmax and
//! cross-entropy) is computed and differentiated a block of rows at a time. Chunk `i` runs its
//! rows' forward pass and, at once, their backward pass; its logits die before chunk `i + 1`'s
//! are made. The head's weight gradient is summed over the chunks, the head input's gradient is
//! the chunks' gradients joined, and the rest of the backward pass goes on from there. The
//! largest tensor of the step is then `1/k` of its size, at the price of `k - 1` additions of
//! the head's weight gradient.
//!
//! The pass works on the structure, not on names: the loss must be a chain of constant scalings
//! of a full sum over a value whose rows are independent (elementwise ops, broadcasts that keep
//! the row axis, reductions over other axes, reshapes that keep it, and a matrix product whose
//! left operand is row-aligned and whose right operand is shared by every row). Anything else,
//! or a head too small to matter, is differentiated whole, exactly as before.
//!
//! Mathematically the chunked step is the whole one; in floating point the loss is summed in
//! `k` partial sums and the head's weight gradient in `k` products, so the result moves by
//! rounding only.

use super::grad;
use super::names::ACCUMULATION;
use crate::error::Result;
use crate::ir::{BinaryOp, Graph, LeafKind, NodeId, Op, ReduceOp, Shape, UnaryOp};
use std::collections::HashMap;

/// The largest chunk of the head's largest tensor, by default: a head whose largest tensor is
/// smaller than this is not split. Each extra chunk reads and writes the head weight's f32
/// gradient sum once more (on an H100, gpt2's head in 8 chunks spent 1.0 ms more in those
/// GEMMs than the whole head): 512 MiB gives gpt2 4 chunks, and the budget fitter halves it
/// where a budget needs smaller ones (`fit::MIN_HEAD_CHUNK_BYTES`).
pub const HEAD_CHUNK_BYTES: usize = 512 << 20;

/// A loss head that can be computed in row chunks ([`find`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// The nodes each chunk recomputes on its rows, in node order (the matrix product first).
    pub region: Vec<NodeId>,
    /// The full sum over the region's last value.
    pub reduction: NodeId,
    /// The scalar nodes from the reduction to the loss, in order (each a constant scaling or a
    /// reshape of the one before).
    pub tail: Vec<NodeId>,
    /// Rows of the head (axis 0 of every region value).
    pub rows: usize,
    /// How many chunks (dividing `rows`).
    pub chunks: usize,
}

/// How each operand of a row-wise node relates to its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    /// Row `r` of the node reads row `r` of the operand: a chunk reads the operand's chunk.
    Rows,
    /// Every row reads all of the operand (a weight, a scalar).
    Shared,
}

/// For a node whose value has `rows` rows on axis 0, how each operand is read, or `None` if the
/// node is not row-wise (a row of it depends on other rows of an operand).
fn row_wise(g: &Graph, id: NodeId, rows: usize) -> Option<Vec<Operand>> {
    let node = g.node(id);
    let dims = node.ty.shape.dims();
    if dims.first() != Some(&rows) {
        return None;
    }
    let same = |x: &NodeId| -> Option<Operand> {
        let s = &g.ty(*x).shape;
        if *s == node.ty.shape {
            Some(Operand::Rows)
        } else if s.rank() == 0 {
            Some(Operand::Shared)
        } else {
            None
        }
    };
    match &node.op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient => node.inputs.iter().map(same).collect(),
        Op::Broadcast => {
            let s = g.ty(node.inputs[0]).shape.dims();
            if s.len() == dims.len() && s[0] == rows {
                Some(vec![Operand::Rows])
            } else if s.len() < dims.len() || s.first() == Some(&1) {
                Some(vec![Operand::Shared])
            } else {
                None
            }
        }
        Op::Reshape => {
            (g.ty(node.inputs[0]).shape.dims().first() == Some(&rows)).then(|| vec![Operand::Rows])
        }
        Op::Reduce { axes, .. } => (!axes.contains(&0)).then(|| vec![Operand::Rows]),
        Op::MatMul { ta: false, .. }
            if dims.len() == 2 && g.ty(node.inputs[1]).shape.rank() == 2 =>
        {
            Some(vec![Operand::Rows, Operand::Shared])
        }
        Op::Iota { axis } if *axis != 0 => Some(Vec::new()),
        Op::Full { .. } => Some(Vec::new()),
        _ => None,
    }
}

/// A scalar constant: a `full`, or a reshape or broadcast of one.
fn constant(g: &Graph, x: NodeId) -> bool {
    match &g.node(x).op {
        Op::Full { .. } => true,
        Op::Reshape | Op::Broadcast => constant(g, g.node(x).inputs[0]),
        _ => false,
    }
}

/// The operand slot a tail node carries the loss through, if it is linear in it with
/// constant coefficients (a scaling by a constant, a negation, a reshape of one element).
fn tail_slot(g: &Graph, id: NodeId) -> Option<usize> {
    let node = g.node(id);
    if node.ty.shape.numel() != 1 {
        return None;
    }
    match &node.op {
        Op::Reshape | Op::Unary(UnaryOp::Neg) => Some(0),
        Op::Binary(BinaryOp::Mul) => {
            match (constant(g, node.inputs[0]), constant(g, node.inputs[1])) {
                (false, true) => Some(0),
                (true, false) => Some(1),
                _ => None,
            }
        }
        Op::Binary(BinaryOp::Div) if constant(g, node.inputs[1]) => Some(0),
        _ => None,
    }
}

/// The loss head of `loss` in `g`, if it is row-wise (see the module) and its largest value is
/// over `max_chunk_bytes`: split into the fewest chunks (dividing its rows, at most four times
/// that many) whose largest value is at most `max_chunk_bytes`. `None` otherwise, and always for
/// `max_chunk_bytes == 0`.
pub fn find(g: &Graph, loss: NodeId, max_chunk_bytes: usize) -> Option<Head> {
    if max_chunk_bytes == 0 {
        return None;
    }
    let users = g.users();
    let pinned = |x: NodeId| {
        g.outputs.values().any(|&o| o == x && o != loss) || g.updates.iter().any(|u| u.value == x)
    };
    // The tail, from the loss back to the full sum.
    let mut tail = Vec::new();
    let mut cur = loss;
    let reduction = loop {
        let node = g.node(cur);
        if let Op::Reduce {
            op: ReduceOp::Sum,
            axes,
        } = &node.op
        {
            let r = g.ty(node.inputs[0]).shape.rank();
            if r >= 1 && axes.len() == r && (0..r).all(|a| axes.contains(&a)) {
                break cur;
            }
        }
        let slot = tail_slot(g, cur)?;
        tail.push(cur);
        cur = node.inputs[slot];
        if users[cur.index()].len() != 1 || pinned(cur) {
            return None;
        }
    };
    tail.reverse();
    let r = g.node(reduction).inputs[0];
    if users[r.index()].len() != 1 || pinned(r) {
        return None;
    }
    let rows = *g.ty(r).shape.dims().first()?;
    // What the reduced value depends on.
    let mut anc = vec![false; r.index() + 1];
    anc[r.index()] = true;
    for i in (0..=r.index()).rev() {
        if anc[i] {
            for x in &g.node(NodeId(i as u32)).inputs {
                anc[x.index()] = true;
            }
        }
    }
    // The head starts at the largest matrix product over the rows that the sum depends on
    // (of equal ones, the nearest the loss).
    let start = g
        .ids()
        .take(r.index() + 1)
        .filter(|&id| anc[id.index()])
        .filter(|&id| {
            matches!(g.node(id).op, Op::MatMul { ta: false, .. })
                && g.ty(id).shape.rank() == 2
                && g.ty(id).shape.dims()[0] == rows
        })
        .max_by_key(|&id| (g.ty(id).bytes(), id))?;
    let mut region_mark = vec![false; r.index() + 1];
    region_mark[start.index()] = true;
    let mut region = vec![start];
    for id in g.ids().take(r.index() + 1).skip(start.index() + 1) {
        if anc[id.index()]
            && g.node(id)
                .inputs
                .iter()
                .any(|x| region_mark.get(x.index()).copied().unwrap_or(false))
        {
            region_mark[id.index()] = true;
            region.push(id);
        }
    }
    let mut largest = 0;
    for &id in &region {
        let how = row_wise(g, id, rows)?;
        for (x, how) in g.node(id).inputs.iter().zip(how) {
            if how == Operand::Shared && region_mark[x.index()] {
                return None;
            }
        }
        // Every user of a region value is in the region (or is the sum, for the last).
        let ok = users[id.index()]
            .iter()
            .all(|u| region_mark.get(u.index()).copied().unwrap_or(false) || *u == reduction);
        if !ok || pinned(id) {
            return None;
        }
        largest = largest.max(g.ty(id).bytes());
    }
    if largest <= max_chunk_bytes {
        return None;
    }
    let fewest = largest.div_ceil(max_chunk_bytes);
    let chunks = (fewest..=4 * fewest).find(|k| rows % k == 0 && *k <= rows)?;
    Some(Head {
        region,
        reduction,
        tail,
        rows,
        chunks,
    })
}

/// What differentiating a loss with its head in chunks made ([`grad_in_chunks`]).
pub struct ChunkedGrad {
    /// The loss as the chunks sum it, times the scale asked for (the old loss node is dead).
    pub loss: NodeId,
    /// The gradient of the loss for each node of `wrt`, in order.
    pub grads: Vec<NodeId>,
    /// How many chunks the head was computed in (1: not split).
    pub chunks: usize,
}

/// The gradient of `loss` with respect to `wrt` (parameters), with the loss head computed and
/// differentiated in row chunks when [`find`] finds one over `max_chunk_bytes`; otherwise
/// [`grad::grad`] of the whole loss, the same nodes as before.
///
/// The returned loss is the chunks' sum times `loss_scale` (1: the loss itself), made right
/// after the last chunk and before the rest of the backward pass, so that it marks where the
/// forward pass ends for the passes that read that from the loss's position.
pub fn grad_in_chunks(
    g: &mut Graph,
    loss: NodeId,
    wrt: &[NodeId],
    max_chunk_bytes: usize,
    loss_scale: f64,
) -> Result<ChunkedGrad> {
    let Some(head) = find(g, loss, max_chunk_bytes) else {
        let grads = grad::grad(g, loss, wrt)?;
        return Ok(ChunkedGrad {
            loss,
            grads,
            chunks: 1,
        });
    };
    let n = g.len();
    // Float values that depend on a parameter: the operands of the head that carry a gradient.
    let mut trained = vec![false; n];
    for id in g.ids() {
        let node = g.node(id);
        trained[id.index()] = match &node.op {
            Op::Leaf {
                kind: LeafKind::Parameter,
                ..
            } => true,
            Op::Compare(_) | Op::Iota { .. } | Op::Full { .. } | Op::StopGradient => false,
            _ => node.ty.dtype.is_float() && node.inputs.iter().any(|x| trained[x.index()]),
        };
    }
    let in_region: std::collections::HashSet<NodeId> = head.region.iter().copied().collect();
    // The operands from outside the head, each once, in the order first read.
    let mut row_operands: Vec<NodeId> = Vec::new();
    let mut shared_operands: Vec<NodeId> = Vec::new();
    let mut how: HashMap<NodeId, Vec<Operand>> = HashMap::new();
    for &id in &head.region {
        let kinds = row_wise(g, id, head.rows).expect("checked by find");
        for (&x, &k) in g.node(id).inputs.iter().zip(&kinds) {
            if in_region.contains(&x) {
                continue;
            }
            let list = match k {
                Operand::Rows => &mut row_operands,
                Operand::Shared => &mut shared_operands,
            };
            if !list.contains(&x) {
                list.push(x);
            }
        }
        how.insert(id, kinds);
    }
    let row_grads: Vec<NodeId> = row_operands
        .iter()
        .copied()
        .filter(|x| trained[x.index()])
        .collect();
    // A shared operand cast down (a weight cast to bf16 for the product) has its chunks'
    // gradients summed in the wider type it was cast from, as the whole head's one product
    // would round once: each chunk's gradient is cast up, then added.
    let mut shared_grads: Vec<NodeId> = Vec::new();
    for &x in shared_operands.iter().filter(|x| trained[x.index()]) {
        let mut x = x;
        while let Op::Convert = g.node(x).op {
            let from = g.node(x).inputs[0];
            if g.ty(from).dtype.size() <= g.ty(x).dtype.size() || !trained[from.index()] {
                break;
            }
            x = from;
        }
        if !shared_grads.contains(&x) {
            shared_grads.push(x);
        }
    }
    let c = head.rows / head.chunks;
    let mut row_parts: Vec<Vec<NodeId>> = vec![Vec::new(); row_grads.len()];
    let mut shared_sums: Vec<Option<NodeId>> = vec![None; shared_grads.len()];
    let mut total: Option<NodeId> = None;
    let outer = g.scope().clone();
    for i in 0..head.chunks {
        let mut map: HashMap<NodeId, NodeId> = HashMap::new();
        for &x in &row_operands {
            g.set_scope(g.origin(x).clone());
            map.insert(x, g.slice(x, 0, i * c, (i + 1) * c)?);
        }
        for &id in &head.region {
            let node = g.node(id).clone();
            let inputs: Vec<NodeId> = node
                .inputs
                .iter()
                .zip(&how[&id])
                .map(|(x, k)| match k {
                    Operand::Rows => map[x],
                    Operand::Shared => *x,
                })
                .collect();
            let mut dims = node.ty.shape.dims().to_vec();
            dims[0] = c;
            let mut ty = node.ty.clone();
            ty.shape = Shape::new(&dims);
            g.set_scope(g.origin(id).clone());
            let new = g.push(node.op.clone(), &inputs, Some(ty))?;
            map.insert(id, new);
        }
        // The chunk's share of the loss: its sum, scaled as the whole sum is.
        let mut part = {
            let node = g.node(head.reduction).clone();
            g.set_scope(g.origin(head.reduction).clone());
            g.push(node.op, &[map[&node.inputs[0]]], Some(node.ty))?
        };
        let mut prev = head.reduction;
        for &t in &head.tail {
            let node = g.node(t).clone();
            let inputs: Vec<NodeId> = node
                .inputs
                .iter()
                .map(|&x| if x == prev { part } else { x })
                .collect();
            g.set_scope(g.origin(t).clone());
            part = g.push(node.op, &inputs, Some(node.ty))?;
            prev = t;
        }
        // Its backward pass, at once, down to the head's operands.
        let wrt_i: Vec<NodeId> = row_grads
            .iter()
            .map(|x| map[x])
            .chain(shared_grads.iter().copied())
            .collect();
        let grads_i = grad::grad(g, part, &wrt_i)?;
        let (rows_i, shared_i) = grads_i.split_at(row_grads.len());
        for (parts, &gi) in row_parts.iter_mut().zip(rows_i) {
            parts.push(gi);
        }
        for (sum, &gi) in shared_sums.iter_mut().zip(shared_i) {
            *sum = Some(match *sum {
                None => gi,
                Some(acc) => g.scoped(ACCUMULATION, |g| g.add(acc, gi))?,
            });
        }
        g.set_scope(g.origin(loss).clone());
        total = Some(match total {
            None => part,
            Some(t) => g.add(t, part)?,
        });
    }
    let mut total = total.expect("at least one chunk");
    if loss_scale != 1.0 {
        total = g.mul_scalar(total, loss_scale)?;
    }
    // The rest of the backward pass, from the head's operands with the chunks' gradients.
    let mut roots = Vec::with_capacity(row_grads.len() + shared_grads.len());
    for (&x, parts) in row_grads.iter().zip(&row_parts) {
        g.set_scope(g.origin(x).backward());
        roots.push((x, g.concat(parts, 0)?));
    }
    for (&x, sum) in shared_grads.iter().zip(&shared_sums) {
        roots.push((x, sum.expect("at least one chunk")));
    }
    g.set_scope(outer);
    let grads = grad::grad_of_roots(g, &roots, wrt)?;
    Ok(ChunkedGrad {
        loss: total,
        grads,
        chunks: head.chunks,
    })
}
