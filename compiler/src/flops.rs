//! Floating-point operations of a step graph, counted from its ops' shapes: what the budget
//! fitter (`compiler::fit`) weighs recomputation against ("the copies add 4% to the step").
//!
//! Matrix products, attention and convolutions dominate and are counted as the usual papers
//! count them (a multiply-add is two operations); every other op counts one operation per
//! element it writes (a reduction one per element it reads). The figures are a model of the
//! work, not a measurement: a fused kernel does the same arithmetic as its primitive ops, so
//! the count is taken on the unfused graph (what fusion receives).
//!
//! [`model`] is the narrower count a training log reports as achieved FLOP/s and as the
//! fraction of the device's peak (model FLOPs utilisation, MFU): the products alone (matrix
//! products, attention, convolutions, forward and backward), as PaLM's appendix B, nanoGPT's
//! `estimate_mfu` and PyTorch's `FlopCounterMode` count them, and without the products the
//! step recomputes for its backward pass under a memory budget. Recomputation is work the
//! hardware does but the model does not need, so counting it would flatter the rate (PaLM calls
//! the count with it "hardware FLOPs utilisation"); elementwise work, reductions and the
//! optimizer's update are left out as those papers leave them out (for gpt2, by a rough count, about 1%
//! of the products). One difference from the 6·N + 12·L·H·Q·T rule of thumb: a causal
//! attention counts half of its square and its backward 2.5 times its forward
//! (FlashAttention's convention, the work its kernels do), where PaLM's formula counts the
//! whole square and the backward as twice the forward (5.8% more than this count for gpt2).

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

/// Whether node `id` is a product: a matmul, an attention or its gradient, a convolution or one
/// of its gradients.
pub fn is_product(g: &Graph, id: NodeId) -> bool {
    match &g.node(id).op {
        Op::MatMul { .. } | Op::MatMulAcc { .. } | Op::Attention { .. } => true,
        Op::AttentionGrad { .. } => true,
        Op::Window(w) => matches!(
            w,
            WindowOp::Conv2d(_)
                | WindowOp::Conv2dGradInput { .. }
                | WindowOp::Conv2dGradWeight { .. }
        ),
        _ => false,
    }
}

/// The model FLOPs of a step graph (unfused or fused; see the module's doc): the products'
/// operations, a `matmul_acc` counted as its product alone, without the copies the step
/// recomputes for its backward pass (named `... (recomputed)` by fusion, [`crate::ir::origin`]).
/// A graph read back from an executable file has no origins, so there a recomputed product
/// cannot be told from the first one and is counted too.
pub fn model(g: &Graph) -> u64 {
    g.ids()
        .filter(|&id| is_product(g, id))
        .filter(|&id| {
            !g.origin(id)
                .sources()
                .iter()
                .any(|s| s.ends_with("(recomputed)"))
        })
        .map(|id| match &g.node(id).op {
            // The accumulation's additions are not the product's.
            Op::MatMulAcc { .. } => of_node(g, id) - g.ty(id).shape.numel() as u64,
            _ => of_node(g, id),
        })
        .sum()
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

    /// nanoGPT's count of a GPT's training step, written out: every weight matrix of shape
    /// `[n, m]` costs 2·n·m FLOPs per token forward and twice that backward (the input's and the
    /// weight's gradients), so 6·n·m; the causal attention's q·kᵀ and p·v cost 2·T·d per token
    /// and layer forward (half of the 4·T·d square), 2.5 times that backward.
    fn gpt_model_flops(cfg: &crate::models::GptConfig) -> u64 {
        let (v, d, l, f, t, b) = (
            cfg.vocab as u64,
            cfg.d_model as u64,
            cfg.layers as u64,
            cfg.d_ff as u64,
            cfg.seq as u64,
            cfg.batch as u64,
        );
        let weights = l * (3 * d * d + d * d + 2 * d * f) + v * d;
        let tokens = b * t;
        let attention_forward = l * 2 * t * d * tokens;
        6 * weights * tokens + attention_forward + attention_forward * 5 / 2
    }

    /// The small GPT both GPT tests trace, at `batch`.
    fn small_gpt(batch: usize) -> crate::models::GptConfig {
        crate::models::GptConfig {
            vocab: 96,
            d_model: 32,
            layers: 2,
            heads: 4,
            d_ff: 64,
            seq: 16,
            batch,
        }
    }

    #[test]
    fn a_gpt_step_s_model_flops_are_six_per_weight_and_token_plus_its_attention() {
        let cfg = small_gpt(3);
        let m = crate::models::gpt(&cfg, DType::F32).unwrap();
        let want = gpt_model_flops(&cfg);
        let opts = crate::pipeline::Options::for_target(crate::lower::Target::Cpu);
        let r = crate::pipeline::rewritten(&m, &Default::default(), &opts).unwrap();
        let base = crate::pipeline::finish(&r, &[]).unwrap();
        assert_eq!(model(&base.step.graph), want, "the traced step");
        assert_eq!(model(&base.graph), want, "the fused step");
        // Every matmul and attention output recomputed for the backward pass: more products
        // run, the model's count stays.
        let heavy: Vec<NodeId> = crate::fit::ordered_candidates(&r)
            .unwrap()
            .iter()
            .map(|c| c.node)
            .collect();
        let recomputing = crate::pipeline::finish(&r, &heavy).unwrap();
        let g = &recomputing.graph;
        let run: u64 = g
            .ids()
            .filter(|&id| is_product(g, id))
            .map(|id| of_node(g, id))
            .sum();
        assert!(
            run > want + want / 20,
            "the recomputing step runs more products: {run} against {want}"
        );
        assert_eq!(model(g), want, "the recomputing step");
    }

    /// The step of `m` traced and differentiated for the CPU (attention recognised, no egg
    /// rewriting, no fusion), with `step`'s options.
    fn traced(m: &crate::model::Model, step: &crate::autodiff::StepOptions) -> Graph {
        let opts = crate::pipeline::Options {
            rewrite: None,
            ..crate::pipeline::Options::for_target(crate::lower::Target::Cpu)
        };
        crate::pipeline::rewritten(m, step, &opts)
            .unwrap()
            .step
            .graph
    }

    #[test]
    fn the_mlp_s_model_flops_are_six_per_weight_and_sample_less_the_input_s_gradient() {
        use crate::models::{MLP_CLASSES as C, MLP_HIDDEN as H, MLP_IN as I};
        let batch = 8;
        let m = crate::models::mlp_with(batch, DType::F32).unwrap();
        // Each weight matrix: 2 per weight and sample forward, 2 for its gradient, 2 for its
        // input's gradient; the first layer's input is the data, which has no gradient. The
        // biases, ReLUs, loss and SGD update are not products.
        let weights = (I * H + H * H + H * C) as u64;
        let want = 6 * weights * batch as u64 - 2 * (I * H * batch) as u64;
        assert_eq!(
            model(&traced(&m, &Default::default())),
            want,
            "the traced step"
        );
        let opts = crate::pipeline::Options::for_target(crate::lower::Target::Cpu);
        let fused = crate::pipeline::compile(&m, &opts).unwrap();
        assert_eq!(model(&fused.graph), want, "the fused step");
        assert_eq!(fused.report.model_flops, Some(want), "the plan's report");
    }

    #[test]
    fn gpt2_s_model_flops_are_six_per_weight_and_token_plus_its_attention() {
        let cfg = crate::models::GptConfig::gpt2();
        let m = crate::models::gpt(&cfg, DType::F32).unwrap();
        let want = gpt_model_flops(&cfg);
        assert_eq!(model(&traced(&m, &Default::default())), want);
        // The figure the user guide quotes (6.615e12); PaLM's formula (the whole attention
        // square, its backward twice its forward: 12·L·d·T per token) counts 5.8% more.
        assert_eq!(want, 6_614_786_506_752);
        let (l, d, t, b) = (12u64, 768u64, 1024u64, 8u64);
        let palm = want - 7 * l * t * d * b * t + 12 * l * d * t * t * b;
        assert!(palm > want + want / 20 && palm < want + want / 15, "{palm}");
    }

    #[test]
    fn an_accumulated_step_counts_every_micro_batch_s_products() {
        let whole = small_gpt(6);
        let micro = crate::models::GptConfig { batch: 2, ..whole };
        let m = crate::models::gpt(&micro, DType::F32).unwrap();
        let step = crate::autodiff::StepOptions {
            accumulate: 3,
            ..Default::default()
        };
        assert_eq!(model(&traced(&m, &step)), gpt_model_flops(&whole));
        let opts = crate::pipeline::Options::for_target(crate::lower::Target::Cpu);
        let r = crate::pipeline::rewritten(&m, &step, &opts).unwrap();
        let fused = crate::pipeline::finish(&r, &[]).unwrap();
        assert_eq!(model(&fused.graph), gpt_model_flops(&whole), "fused");
    }
}
