//! Floating-point operations of a step graph, counted from its ops' shapes: what the budget
//! fitter (`compiler::fit`) weighs recomputation against ("the copies add 4% to the step").
//!
//! Matrix products, attention and convolutions dominate and are counted as the usual papers
//! count them (a multiply-add is two operations); every other op counts one operation per
//! element it writes (a reduction one per element it reads). The figures are a model of the
//! work, not a measurement: a fused kernel does the same arithmetic as its primitive ops, so
//! the count is taken on the unfused graph (what fusion receives).

use crate::ir::window::WindowOp;
use crate::ir::{Graph, NodeId, Op};
use smallvec::SmallVec;

/// The operations of node `id` of `g` (zero for leaves, views and library bookkeeping).
pub fn of_node(g: &Graph, id: NodeId) -> u64 {
    let n = g.node(id);
    let numel = |x: NodeId| g.ty(x).shape.numel() as u64;
    let dims = |x: NodeId| g.ty(x).shape.dims().to_vec();
    match &n.op {
        Op::Leaf { .. }
        | Op::Reshape
        | Op::StopGradient
        | Op::Broadcast
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::Result { .. }
        | Op::Gather
        | Op::Full { .. }
        | Op::Iota { .. } => 0,
        // [..., m, k] x [..., k, n]: 2·m·n·k per batch entry; the output has ...·m·n elements.
        Op::MatMul { ta, .. } => {
            let a = dims(n.inputs[0]);
            let k = if *ta {
                a[a.len().saturating_sub(2)]
            } else {
                *a.last().unwrap_or(&1)
            };
            2 * numel(id) * k as u64
        }
        // The product's 2·m·n·k, plus one addition per output element.
        Op::MatMulAcc { ta, .. } => {
            let a = dims(n.inputs[1]);
            let k = if *ta {
                a[a.len().saturating_sub(2)]
            } else {
                *a.last().unwrap_or(&1)
            };
            2 * numel(id) * k as u64 + numel(id)
        }
        // q·kᵀ and p·v: 4·Tq·Tk·D per batch-and-head entry, half of it under a causal mask
        // (FlashAttention's convention).
        Op::Attention { .. } => attention(g, id),
        // The backward pass does five products of that size to the forward's two: 2.5 times.
        Op::AttentionGrad { .. } => attention(g, id) * 5 / 2,
        Op::Window(w) => match w {
            // Each output element of a convolution is a dot product over C/g·kh·kw; each grad
            // does the same products again, arranged differently.
            WindowOp::Conv2d(_) => {
                let wt = dims(n.inputs[1]);
                2 * numel(id) * wt[1..].iter().product::<usize>() as u64
            }
            WindowOp::Conv2dGradInput { .. } => {
                // (dy [N,O,Ho,Wo], w [O,C/g,kh,kw]): every dy element meets C/g·kh·kw weights.
                let wt = dims(n.inputs[1]);
                2 * numel(n.inputs[0]) * wt[1..].iter().product::<usize>() as u64
            }
            WindowOp::Conv2dGradWeight { .. } => {
                // (x, dy [N,O,Ho,Wo]) -> dw [O,C/g,kh,kw]: every dy element meets C/g·kh·kw inputs.
                let w = dims(id);
                2 * numel(n.inputs[1]) * w[1..].iter().product::<usize>() as u64
            }
            WindowOp::MaxPool2d(p) | WindowOp::MaxPool2dGrad(p) => {
                numel(id) * (p.kernel[0] * p.kernel[1]) as u64
            }
        },
        Op::Reduce { .. } => numel(n.inputs[0]),
        Op::ScatterAdd { .. } => numel(n.inputs[1]),
        // A reduction: one per element read, whether every rank keeps the mean or its rows.
        Op::AllReduce { .. } | Op::ReduceScatter { .. } => n.inputs.iter().map(|&x| numel(x)).sum(),
        // A copy: no arithmetic.
        Op::AllGather { .. } => 0,
        Op::Fused(k) => numel(id) * k.body.len().max(1) as u64,
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::Dropout { .. } => numel(id),
    }
}

/// 4·(batch·heads)·Tq·Tk·D, halved when causal; 0 for operands that break the op's rules.
fn attention(g: &Graph, id: NodeId) -> u64 {
    let n = g.node(id);
    let types: SmallVec<[&crate::ir::TensorType; 6]> = n.inputs.iter().map(|&x| g.ty(x)).collect();
    let Ok(p) = crate::ir::attention_problem(&n.op, &types) else {
        return 0;
    };
    let full = 4 * (p.batch_heads * p.seq_q * p.seq_k * p.head_dim) as u64;
    if p.causal {
        full / 2
    } else {
        full
    }
}

/// The operations of the whole graph.
pub fn of_graph(g: &Graph) -> u64 {
    g.ids().map(|id| of_node(g, id)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;

    #[test]
    fn a_matmul_costs_two_operations_per_multiply_add() {
        let mut g = Graph::new();
        let a = g.input("a", [8, 3], DType::F32).unwrap();
        let b = g.input("b", [3, 5], DType::F32).unwrap();
        let c = g.push(Op::MATMUL, &[a, b], None).unwrap();
        assert_eq!(of_node(&g, c), 2 * 8 * 5 * 3);
        assert_eq!(of_graph(&g), 2 * 8 * 5 * 3);
    }
}
