//! Reverse mode: walk the graph backwards from the loss, apply each primitive's vector-Jacobian
//! product (VJP), and sum contributions where a value has several users. The backward pass is
//! appended to the same graph, built from the same primitives, so every later pass treats it
//! like the forward pass.

use super::slices::{self, slice_vjp, Part};
use crate::error::{IrError, Result};
use crate::ir::{BinaryOp, CmpOp, Graph, Node, NodeId, Op, ReduceOp, Shape, UnaryOp, WindowOp};

/// Appends the gradient of the scalar `loss` with respect to each node of `wrt` and returns the
/// gradient nodes in the same order. A `wrt` node the loss does not depend on gets zeros.
pub fn grad(g: &mut Graph, loss: NodeId, wrt: &[NodeId]) -> Result<Vec<NodeId>> {
    let lt = g.ty(loss).clone();
    if lt.shape.rank() != 0 || !lt.dtype.is_float() {
        return Err(IrError::Invalid(format!(
            "the loss {loss} must be a float scalar, not {lt}"
        )));
    }
    grad_seeded(g, loss, None, wrt)
}

/// The vector-Jacobian product of `root` (any float value) with `seed` (a value of `root`'s
/// type, the gradient flowing into it from later computation): the gradient with respect to
/// each node of `wrt` of `Σ root · seed`. `None` seeds a scalar root with 1, as [`grad`] does.
/// A step whose loss head is split into row chunks ([`super::chunk`]) carries on from the
/// head's input with the chunks' gradients joined as the seed.
pub fn grad_seeded(
    g: &mut Graph,
    loss: NodeId,
    seed: Option<NodeId>,
    wrt: &[NodeId],
) -> Result<Vec<NodeId>> {
    let seed = match seed {
        Some(s) => s,
        None => {
            // Named as the backward walk names its nodes: after the loss.
            let (dtype, origin) = (g.ty(loss).dtype, g.origin(loss).backward());
            let outer = g.set_scope(origin);
            let one = g.full(1.0, Shape::scalar(), dtype);
            g.set_scope(outer);
            one?
        }
    };
    grad_of_roots(g, &[(loss, seed)], wrt)
}

/// The gradient with respect to each node of `wrt` of `Σ_r Σ root_r · seed_r` over several
/// `(root, seed)` pairs at once: one backward walk in which each root's adjoint starts as its
/// seed (plus whatever later roots contribute to it).
pub fn grad_of_roots(
    g: &mut Graph,
    roots: &[(NodeId, NodeId)],
    wrt: &[NodeId],
) -> Result<Vec<NodeId>> {
    for &(root, s) in roots {
        if g.ty(s) != g.ty(root) {
            return Err(IrError::Invalid(format!(
                "the seed {s} of {root}'s gradient is {}, not {}",
                g.ty(s),
                g.ty(root)
            )));
        }
    }
    let Some(loss) = roots.iter().map(|&(r, _)| r).max() else {
        return wrt.iter().map(|&w| g.full_like(0.0, w)).collect();
    };
    let roots_only: Vec<NodeId> = roots.iter().map(|&(r, _)| r).collect();
    let wants = needs_gradient(g, &roots_only, wrt);
    let users = user_counts(g, loss);
    let mut adjoint = Adjoints {
        sum: vec![None; loss.index() + 1],
        joined: slices::joined(g, loss, &users),
        parts: (0..=loss.index()).map(|_| Vec::new()).collect(),
    };
    // Each backward node is named after the forward node whose VJP made it.
    let outer = g.set_scope(g.origin(loss).backward());
    for &(root, s) in roots {
        adjoint.add(g, root, Part::Dense(s))?;
    }
    for i in (0..=loss.index()).rev() {
        let id = NodeId(i as u32);
        let origin = g.origin(id).backward();
        g.set_scope(origin);
        adjoint.finish(g, id)?;
        let Some(gy) = adjoint.sum[i] else { continue };
        if let Some((z, gz)) = softmax_vjp(g, id, gy, &users, &wants)? {
            adjoint.add(g, z, Part::Dense(gz))?;
            continue;
        }
        let node = g.node(id).clone();
        let attention = match node.op {
            // One backward op gives every operand's gradient.
            Op::Attention { .. } => Some(g.attention_grad(id, gy)?),
            _ => None,
        };
        for (slot, &x) in node.inputs.iter().enumerate() {
            if !wants[x.index()] {
                continue;
            }
            let part = match (&attention, &node.op) {
                (Some(grads), _) => Part::Dense(grads[slot]),
                (None, &Op::Slice { axis, start, end }) if adjoint.joined[x.index()] => {
                    Part::Slice {
                        axis,
                        start,
                        end,
                        gy,
                    }
                }
                (None, _) => Part::Dense(vjp(g, id, slot, gy)?),
            };
            adjoint.add(g, x, part)?;
        }
    }
    g.set_scope(outer);
    wrt.iter()
        .map(|&w| match adjoint.sum.get(w.index()).copied().flatten() {
            Some(gw) => Ok(gw),
            None => g.full_like(0.0, w),
        })
        .collect()
}

/// Each node's gradient during the backward walk: the running sum of its contributions, or, for
/// a node read through slices ([`slices::joined`]), its contributions kept until every reader
/// has given one and then joined by segment ([`slices::join`]).
struct Adjoints {
    sum: Vec<Option<NodeId>>,
    joined: Vec<bool>,
    parts: Vec<Vec<Part>>,
}

impl Adjoints {
    /// Adds contribution `part` to `x`'s gradient: at once, or kept for [`Adjoints::finish`].
    fn add(&mut self, g: &mut Graph, x: NodeId, part: Part) -> Result<()> {
        let i = x.index();
        if self.joined[i] {
            self.parts[i].push(part);
            return Ok(());
        }
        let gx = match part {
            Part::Dense(d) => d,
            Part::Slice {
                axis,
                start,
                end,
                gy,
            } => slice_vjp(g, &g.ty(x).shape.clone(), axis, start, end, gy)?,
        };
        self.sum[i] = Some(match self.sum[i] {
            None => gx,
            Some(prev) => g.add(prev, gx)?,
        });
        Ok(())
    }

    /// Joins `x`'s kept contributions, once the walk reaches `x` (every reader has given one).
    fn finish(&mut self, g: &mut Graph, x: NodeId) -> Result<()> {
        let parts = std::mem::take(&mut self.parts[x.index()]);
        if !parts.is_empty() {
            let xs = g.ty(x).shape.clone();
            self.sum[x.index()] = Some(slices::join(g, &xs, parts)?);
        }
        Ok(())
    }
}

/// How many operand slots of the nodes up to `loss` read each node.
fn user_counts(g: &Graph, loss: NodeId) -> Vec<usize> {
    let mut n = vec![0; loss.index() + 1];
    for i in 0..=loss.index() {
        for x in &g.node(NodeId(i as u32)).inputs {
            n[x.index()] += 1;
        }
    }
    n
}

/// The softmax VJP in terms of its output: for `y = e / Σ e` with `e = exp(z)` (the sum over
/// some axes, broadcast back), `dz = y · (dy − Σ dy·y)`. Returns `(z, dz)` when `y` is such a
/// quotient and `e` and its sum feed nothing else, so no other gradient reaches them.
///
/// Primitive by primitive, autodiff would write `dz = e · (dy/s − Σ(dy·y)/s)`: the same value,
/// but it reads `e`, so the backward pass keeps the scores (or recomputes `exp` from them) next
/// to `y`, which it must keep anyway. Reading only `y` lets the scores die after the forward
/// pass, and the backward kernel reads two tensors instead of recomputing the softmax.
fn softmax_vjp(
    g: &mut Graph,
    y: NodeId,
    gy: NodeId,
    users: &[usize],
    wants: &[bool],
) -> Result<Option<(NodeId, NodeId)>> {
    let node = g.node(y);
    if node.op != Op::Binary(BinaryOp::Div) {
        return Ok(None);
    }
    let (e, b) = (node.inputs[0], node.inputs[1]);
    let s = match &g.node(b).op {
        Op::Broadcast if users[b.index()] == 1 => g.node(b).inputs[0],
        _ => b,
    };
    let Op::Reduce {
        op: ReduceOp::Sum,
        axes,
    } = &g.node(s).op
    else {
        return Ok(None);
    };
    let axes = axes.clone();
    if g.node(s).inputs[0] != e
        || g.node(e).op != Op::Unary(UnaryOp::Exp)
        || users[e.index()] != 2
        || users[s.index()] != 1
    {
        return Ok(None);
    }
    let z = g.node(e).inputs[0];
    if !wants[z.index()] {
        return Ok(None);
    }
    let t = g.mul(gy, y)?;
    let r = g.sum(t, &axes)?;
    let d = g.sub(gy, r)?;
    Ok(Some((z, g.mul(y, d)?)))
}

/// Marks the float nodes that lie on a path from some `wrt` node to a root: only they need adjoints.
fn needs_gradient(g: &Graph, roots: &[NodeId], wrt: &[NodeId]) -> Vec<bool> {
    let n = roots.iter().map(|r| r.index() + 1).max().unwrap_or(0);
    let mut from_wrt = vec![false; n];
    for &w in wrt {
        if w.index() < n {
            from_wrt[w.index()] = true;
        }
    }
    for i in 0..n {
        let node = g.node(NodeId(i as u32));
        if !from_wrt[i] && node.ty.dtype.is_float() && differentiable(&node.op) {
            from_wrt[i] = node.inputs.iter().any(|x| from_wrt[x.index()]);
        }
    }
    let mut to_loss = vec![false; n];
    for r in roots {
        to_loss[r.index()] = true;
    }
    for i in (0..n).rev() {
        if to_loss[i] && from_wrt[i] {
            for x in &g.node(NodeId(i as u32)).inputs {
                to_loss[x.index()] = true;
            }
        }
    }
    (0..n).map(|i| from_wrt[i] && to_loss[i]).collect()
}

/// Ops whose float output carries a gradient to its float operands.
fn differentiable(op: &Op) -> bool {
    !matches!(
        op,
        Op::Compare(_) | Op::Leaf { .. } | Op::Full { .. } | Op::Iota { .. } | Op::StopGradient
    )
}

/// The gradient contribution of node `y` to its operand number `slot`, given `gy` = dL/dy.
fn vjp(g: &mut Graph, y: NodeId, slot: usize, gy: NodeId) -> Result<NodeId> {
    let node = g.node(y).clone();
    let x = node.inputs[slot];
    let xs = g.ty(x).shape.clone();
    match &node.op {
        Op::Unary(u) => unary_vjp(g, *u, x, y, gy),
        Op::Binary(b) => binary_vjp(g, *b, &node.inputs, y, slot, gy),
        Op::Select => {
            let cond = node.inputs[0];
            let zero = g.full_like(0.0, gy)?;
            if slot == 1 {
                g.select(cond, gy, zero)
            } else {
                g.select(cond, zero, gy)
            }
        }
        Op::Broadcast => unbroadcast(g, gy, &xs),
        Op::Reshape => g.reshape(gy, xs),
        Op::Transpose { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            g.transpose(gy, &inverse)
        }
        Op::Slice { axis, start, end } => slice_vjp(g, &xs, *axis, *start, *end, gy),
        Op::Concat { axis } => {
            let start: usize = node.inputs[..slot]
                .iter()
                .map(|&i| g.ty(i).shape.dims()[*axis])
                .sum();
            g.slice(gy, *axis, start, start + xs.dims()[*axis])
        }
        Op::Reduce {
            op: ReduceOp::Sum, ..
        } => g.broadcast_to(gy, xs),
        Op::Reduce {
            op: ReduceOp::Max,
            axes,
        } => max_vjp(g, x, y, &xs, axes, gy),
        Op::MatMul { ta, tb } => {
            let (a, b) = (node.inputs[0], node.inputs[1]);
            matmul_vjp(g, a, b, *ta, *tb, slot == 0, gy)
        }
        Op::MatMulAcc { ta, tb } => {
            // y = c + a·b: dc = gy; da and db as for `matmul(a, b)`, from gy in the operands'
            // dtype (bf16 operands accumulated into f32: the product's gradient is the sum's,
            // cast down as autocast's `convert(matmul)` would pass it).
            if slot == 0 {
                return Ok(gy);
            }
            let (a, b) = (node.inputs[1], node.inputs[2]);
            let dt = g.ty(a).dtype;
            let gy = if g.ty(gy).dtype == dt {
                gy
            } else {
                g.convert(gy, dt)?
            };
            matmul_vjp(g, a, b, *ta, *tb, slot == 1, gy)
        }
        Op::Gather => {
            let rows = xs.dims()[0];
            g.scatter_add(node.inputs[1], gy, rows)
        }
        Op::ScatterAdd { .. } => g.gather(gy, node.inputs[0]),
        Op::Convert => {
            let dt = g.ty(x).dtype;
            g.convert(gy, dt)
        }
        Op::Window(w) => window_vjp(g, *w, &node.inputs, slot, gy),
        // Linear in x given the mask, and the mask is the same draw again: the same op on dy.
        Op::Dropout { p, salt } if slot == 0 => g.dropout_mask(gy, node.inputs[1], *p, *salt),
        _ => Err(no_vjp(g, y, &node)),
    }
}

/// The VJP of an elementwise unary op `y = u(x)`.
fn unary_vjp(g: &mut Graph, u: UnaryOp, x: NodeId, y: NodeId, gy: NodeId) -> Result<NodeId> {
    match u {
        UnaryOp::Neg => g.neg(gy),
        UnaryOp::Exp => g.mul(gy, y),
        UnaryOp::Log => g.div(gy, x),
        UnaryOp::Sqrt => {
            // d sqrt(x) = 1 / (2 sqrt(x))
            let two_y = g.mul_scalar(y, 2.0)?;
            g.div(gy, two_y)
        }
        UnaryOp::Tanh => {
            let yy = g.mul(y, y)?;
            let one = g.full_like(1.0, y)?;
            let d = g.sub(one, yy)?;
            g.mul(gy, d)
        }
        UnaryOp::Recip => {
            let yy = g.mul(y, y)?;
            let t = g.mul(gy, yy)?;
            g.neg(t)
        }
        UnaryOp::Erf => {
            // d erf(x) = 2/√π · e^(−x²)
            let xx = g.mul(x, x)?;
            let n = g.neg(xx)?;
            let e = g.exp(n)?;
            let d = g.mul_scalar(e, std::f64::consts::FRAC_2_SQRT_PI)?;
            g.mul(gy, d)
        }
    }
}

/// The VJP of an elementwise binary op `y = b(a, c)` (`inputs` are `a, c`) to operand `slot`.
fn binary_vjp(
    g: &mut Graph,
    b: BinaryOp,
    inputs: &[NodeId],
    y: NodeId,
    slot: usize,
    gy: NodeId,
) -> Result<NodeId> {
    let (a, c) = (inputs[0], inputs[1]);
    match (b, slot) {
        (BinaryOp::Add, _) => Ok(gy),
        (BinaryOp::Sub, 0) => Ok(gy),
        (BinaryOp::Sub, _) => g.neg(gy),
        (BinaryOp::Mul, 0) => g.mul(gy, c),
        (BinaryOp::Mul, _) => g.mul(gy, a),
        (BinaryOp::Div, 0) => g.div(gy, c),
        (BinaryOp::Div, _) => {
            // d(a/c)/dc = -(a/c)/c
            let t = g.div(y, c)?;
            let t = g.mul(gy, t)?;
            g.neg(t)
        }
        // The second operand takes the gradient where `a <= c` (`a >= c` for min), the
        // first elsewhere: where `a` wins, and where either is NaN (the output is NaN
        // then). Ties go to the second operand, so max(x, 0) has gradient 0 at x = 0 and
        // the gradient itself at x = NaN, as PyTorch's relu backward
        // (`threshold_backward`: the gradient where the output is not <= 0). PyTorch's
        // `maximum` of two tensors gives a NaN operand's gradient to both operands (and
        // half to each at ties); here one operand takes all of it.
        (BinaryOp::Max, _) => route(g, CmpOp::Le, a, c, slot, gy),
        (BinaryOp::Min, _) => route(g, CmpOp::Ge, a, c, slot, gy),
    }
}

/// The VJP of `y = max(x)` over `axes`, for `x` shaped `xs`.
fn max_vjp(
    g: &mut Graph,
    x: NodeId,
    y: NodeId,
    xs: &Shape,
    axes: &[usize],
    gy: NodeId,
) -> Result<NodeId> {
    // Ties share the gradient equally, as PyTorch's amax does: `(gy / count) · hit`.
    // A NaN max matches no element (count 0), so its row's gradient is NaN, as
    // PyTorch's (`gy / 0 · 0`).
    let yb = g.broadcast_to(y, xs.clone())?;
    let hit = g.compare(CmpOp::Eq, x, yb)?;
    let dt = g.ty(x).dtype;
    let hits = g.convert(hit, dt)?;
    let count = g.sum(hits, axes)?;
    let share = g.div(gy, count)?;
    let share = g.broadcast_to(share, xs.clone())?;
    g.mul(share, hits)
}

/// The VJP of the product `a·b` (read transposed as `ta`, `tb` say) to `a` if `wrt_a`, else
/// to `b`.
fn matmul_vjp(
    g: &mut Graph,
    a: NodeId,
    b: NodeId,
    ta: bool,
    tb: bool,
    wrt_a: bool,
    gy: NodeId,
) -> Result<NodeId> {
    // y = A'B' with A' = A^T if ta, else A (B' likewise). dA' = gy B'^T and
    // dB' = A'^T gy; a transposed operand takes the transpose of its adjoint, which the
    // flags express without a transpose op: (gy B'^T)^T = B' gy^T, (A'^T gy)^T = gy^T A'.
    match (wrt_a, ta, tb) {
        (true, false, _) => g.matmul_t(gy, b, false, !tb),
        (true, true, _) => g.matmul_t(b, gy, tb, true),
        (false, _, false) => g.matmul_t(a, gy, !ta, false),
        (false, _, true) => g.matmul_t(gy, a, true, ta),
    }
}

/// Why node `y` (`node`) passes no gradient to its operands here: ops made after autodiff,
/// attention (whose gradient is taken in `grad`), and ops `needs_gradient` should have left
/// out.
fn no_vjp(g: &Graph, y: NodeId, node: &Node) -> IrError {
    match &node.op {
        Op::StopGradient => unreachable!("stop_gradient passes no gradient"),
        Op::Result { index } if g.node(node.inputs[0]).op.is_attention() => {
            IrError::Invalid(format!(
                "cannot differentiate through {y}, output {index} of the {} {}: only an attention's \
                 out carries a gradient (its lse is for the backward pass)",
                g.node(node.inputs[0]).op.name(),
                node.inputs[0]
            ))
        }
        Op::Fused(_) | Op::Result { .. } => IrError::Invalid(format!(
            "cannot differentiate through {} (fusion runs after autodiff)",
            node.op.name()
        )),
        Op::Attention { .. } => unreachable!("the attention's gradient is taken in `grad`"),
        Op::AllReduce { .. } | Op::AllGather { .. } | Op::ReduceScatter { .. } => {
            IrError::Invalid(format!(
                "cannot differentiate through {y} ({}): it is made after the backward pass",
                node.op.name()
            ))
        }
        Op::AttentionGrad { .. } => IrError::Invalid(format!(
            "cannot differentiate through {y} (attention_grad): no second derivative of attention"
        )),
        Op::Dropout { .. } => IrError::Invalid(format!(
            "{y} (dropout) carries no gradient to its seed; this is a bug in needs_gradient"
        )),
        Op::Leaf { .. } | Op::Full { .. } | Op::Iota { .. } | Op::Compare(_) => {
            IrError::Invalid(format!(
                "{} ({y}) carries no gradient; this is a bug in needs_gradient",
                node.op.name()
            ))
        }
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Select
        | Op::Broadcast
        | Op::Reshape
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::Reduce { .. }
        | Op::MatMul { .. }
        | Op::MatMulAcc { .. }
        | Op::Gather
        | Op::ScatterAdd { .. }
        | Op::Convert
        | Op::Window(_) => unreachable!("`vjp` differentiates {}", node.op.name()),
    }
}

/// The VJPs of convolution and pooling. A conv is bilinear in its input and weight, and its two
/// backward ops are the other two products of the same bilinear form, so each has a VJP made of
/// the three ops again (second derivatives work): for `y = conv(x, w)`, `dx = grad_input(dy, w)`
/// and `dw = grad_weight(x, dy)`; for `dx = grad_input(dy, w)`, `d(dy) = conv(gdx, w)` and
/// `dw = grad_weight(gdx, dy)`; for `dw = grad_weight(x, dy)`, `dx = grad_input(dy, gdw)` and
/// `d(dy) = conv(x, gdw)`. Max pooling's backward recomputes the argmax from `x`.
fn window_vjp(
    g: &mut Graph,
    w: WindowOp,
    inputs: &[NodeId],
    slot: usize,
    gy: NodeId,
) -> Result<NodeId> {
    let hw = |g: &Graph, x: NodeId| {
        let d = g.ty(x).shape.dims();
        [d[2], d[3]]
    };
    let (a, b) = (inputs[0], *inputs.get(1).unwrap_or(&inputs[0]));
    match (w, slot) {
        (WindowOp::Conv2d(conv), 0) => g.conv2d_grad_input(gy, b, conv, hw(g, a)),
        (WindowOp::Conv2d(conv), _) => g.conv2d_grad_weight(a, gy, conv, hw(g, b)),
        (WindowOp::Conv2dGradInput { conv, .. }, 0) => g.conv2d(gy, b, conv),
        (WindowOp::Conv2dGradInput { conv, .. }, _) => g.conv2d_grad_weight(gy, a, conv, hw(g, b)),
        (WindowOp::Conv2dGradWeight { conv, .. }, 0) => g.conv2d_grad_input(b, gy, conv, hw(g, a)),
        (WindowOp::Conv2dGradWeight { conv, .. }, _) => g.conv2d(a, gy, conv),
        (WindowOp::MaxPool2d(p), _) => g.max_pool2d_grad(a, gy, p),
        (WindowOp::MaxPool2dGrad(_), _) => Err(IrError::Invalid(
            "max_pool2d_grad has no gradient here (a second derivative of max pooling); \
             differentiate the forward pass once"
                .into(),
        )),
    }
}

/// Gradient of `max`/`min`: operand 1 takes it where `a cmp c` holds, operand 0 elsewhere
/// (where the comparison fails, a NaN operand included).
fn route(
    g: &mut Graph,
    cmp: CmpOp,
    a: NodeId,
    c: NodeId,
    slot: usize,
    gy: NodeId,
) -> Result<NodeId> {
    let second = g.compare(cmp, a, c)?;
    let zero = g.full_like(0.0, gy)?;
    if slot == 0 {
        g.select(second, zero, gy)
    } else {
        g.select(second, gy, zero)
    }
}

/// Sums `gy` over the axes a broadcast to its shape created, giving a tensor of shape `to`.
pub fn unbroadcast(g: &mut Graph, gy: NodeId, to: &Shape) -> Result<NodeId> {
    let from = g.ty(gy).shape.clone();
    let off = from.rank() - to.rank();
    let axes: Vec<usize> = (0..from.rank())
        .filter(|&i| i < off || (to.dims()[i - off] == 1 && from.dims()[i] != 1))
        .collect();
    let summed = if axes.is_empty() {
        gy
    } else {
        g.sum(gy, &axes)?
    };
    g.reshape(summed, to.clone())
}
