//! A ReLU's mask recomputed from the ReLU's own output, for the budget fitter.
//!
//! `relu(x)` is traced as `y = select(m, 0, x)` with the mask `m = (x <= 0)`
//! ([`crate::trace::nn::relu`]), and its backward reads only `m`. Fusion keeps `m` (one byte an
//! element) from the forward pass to the backward one when recomputing it from `x` would read
//! more than it frees: a ResNet block's last ReLU, whose `x` is the sum of a batch norm and the
//! block's input, two full-size values. But `y` itself is often kept for the backward pass
//! anyway (the next convolution's weight gradient reads it), and `m = (y <= 0)` exactly: where
//! `x <= 0`, `y` is 0; where `x > 0`, `y` is `x`; where `x` is NaN, so is `y`, and both
//! comparisons are false. So `m` can be recomputed from `y` in the backward kernel that reads
//! `m` (one more full-size read, no extra pass, no chain of recomputation), and the mask's
//! bytes are freed from the end of the forward pass to that kernel. This is PyTorch's own
//! rule: its ReLU backward (`threshold_backward(grad, result, 0)`) reads the output.
//!
//! One case differs in a bf16 step: a kernel computes bf16 arithmetic in f32 and rounds where
//! it stores, so `x` is compared unrounded and `y` rounded; a positive `x` below half of bf16's
//! smallest subnormal (2⁻¹³⁴) rounds to `y = 0`, and the recomputed mask then stops the
//! gradient there, as PyTorch's does on its bf16 output. In f32 the two masks are the same,
//! bit for bit.
//!
//! This file only recognises the pattern; [`super::remat`] builds the copies, and the budget
//! fitter (`compiler::fit`) decides which masks are worth it.

use crate::ir::{CmpOp, Graph, NodeId, Op, Users};

/// Whether `z` is a constant zero: `full(0)`, through broadcasts and reshapes.
fn is_zero(g: &Graph, mut z: NodeId) -> bool {
    loop {
        match &g.node(z).op {
            Op::Full { value } => return *value == 0.0,
            Op::Broadcast | Op::Reshape => z = g.node(z).inputs[0],
            _ => return false,
        }
    }
}

/// The ReLU output `y = select(m, 0, x)` of the mask `m = (x <= 0)`, if `m` is one: a
/// comparison `x <= 0` one of whose readers selects zero where it holds and `x` elsewhere,
/// with `y` of `x`'s type.
pub fn output_of(g: &Graph, users: &Users, m: NodeId) -> Option<NodeId> {
    let n = g.node(m);
    if !matches!(n.op, Op::Compare(CmpOp::Le)) || n.inputs.len() != 2 || !is_zero(g, n.inputs[1]) {
        return None;
    }
    let x = n.inputs[0];
    users[m.index()].iter().copied().find(|&y| {
        let s = g.node(y);
        matches!(s.op, Op::Select)
            && s.inputs.len() == 3
            && s.inputs[0] == m
            && s.inputs[2] == x
            && is_zero(g, s.inputs[1])
            && g.ty(y) == g.ty(x)
    })
}
