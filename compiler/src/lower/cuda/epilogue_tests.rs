//! The bias epilogue's rule ([`super::epilogue`]): which kernels are bias adds, and which
//! matmuls of a compiled step take theirs into the GEMM.

use super::epilogue::{bias_add, BiasAdd};
use super::{DeviceOp, Program};
use crate::ir::{DType, Graph, NodeId, Op};
use crate::lower::{deps, Target};
use crate::pipeline;
use crate::precision::Precision;
use crate::trace::nn;
use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::{BinaryOp, UnaryOp};

/// `out = product + bias` over `[rows, cols]` as the fusion writes it under bf16: the bf16
/// product widened, the f32 bias rounded to bf16 and widened, the f32 sum rounded to bf16;
/// with `swap` the bias is input 0.
fn bf16_bias_add(rows: usize, cols: usize, swap: bool) -> FusedKernel {
    let product = Input {
        dtype: DType::BF16,
        len: rows * cols,
        access: Access::contiguous(&[rows, cols]),
    };
    let bias = Input {
        dtype: DType::F32,
        len: cols,
        access: Access {
            offset: 0,
            strides: vec![0, 1],
        },
    };
    let (p, b) = if swap { (1, 0) } else { (0, 1) };
    let mut inputs = vec![product.clone(), bias.clone()];
    if swap {
        inputs.swap(0, 1);
    }
    FusedKernel {
        domain: vec![rows, cols],
        reduce_axes: vec![],
        inputs,
        body: vec![
            Inst::Load { input: p },
            Inst::Convert {
                x: 0,
                to: DType::F32,
            },
            Inst::Load { input: b },
            Inst::Convert {
                x: 2,
                to: DType::BF16,
            },
            Inst::Convert {
                x: 3,
                to: DType::F32,
            },
            Inst::binary(BinaryOp::Add, 1, 4),
            Inst::Convert {
                x: 5,
                to: DType::BF16,
            },
        ],
        outputs: vec![Output { value: 6 }],
    }
}

#[test]
fn a_bias_add_is_recognized_whichever_input_the_bias_is() {
    assert_eq!(
        bias_add(&bf16_bias_add(8, 6, false)),
        Some(BiasAdd {
            product: 0,
            bias: 1
        })
    );
    assert_eq!(
        bias_add(&bf16_bias_add(8, 6, true)),
        Some(BiasAdd {
            product: 1,
            bias: 0
        })
    );
}

#[test]
fn a_kernel_doing_more_than_adding_a_bias_along_the_last_axis_is_not_a_bias_add() {
    // A GELU after the add.
    let mut k = bf16_bias_add(8, 6, false);
    k.body.push(Inst::unary(UnaryOp::Tanh, 6));
    k.outputs[0].value = 7;
    assert_eq!(bias_add(&k), None);
    // A product of the two, not a sum.
    let mut k = bf16_bias_add(8, 6, false);
    k.body[5] = Inst::binary(BinaryOp::Mul, 1, 4);
    assert_eq!(bias_add(&k), None);
    // A bias along the rows (one value a row), not the columns.
    let mut k = bf16_bias_add(8, 6, false);
    k.inputs[1] = Input {
        dtype: DType::F32,
        len: 8,
        access: Access {
            offset: 0,
            strides: vec![1, 0],
        },
    };
    assert_eq!(bias_add(&k), None);
    // The product read transposed.
    let mut k = bf16_bias_add(8, 6, false);
    k.inputs[0].access.strides = vec![1, 8];
    assert_eq!(bias_add(&k), None);
    // A column sum of the same.
    let mut k = bf16_bias_add(8, 6, false);
    k.reduce_axes = vec![0];
    assert_eq!(bias_add(&k), None);
}

/// A step whose first linear layer's output (bias added) is read only by a second linear
/// layer: the bias add is a kernel of its own, as gpt2's qkv bias add before the attention.
fn two_linears(precision: Precision) -> pipeline::Compiled {
    let mut g = Graph::new();
    let x = g.input("x", [64, 32], DType::F32).unwrap();
    let y = nn::linear(&mut g, "a", x, 32, 48, true).unwrap();
    let z = nn::linear(&mut g, "b", y, 48, 16, false).unwrap();
    let l = g.sum_all(z).unwrap();
    g.set_output(crate::autodiff::LOSS, l).unwrap();
    let m = crate::model::Model {
        precision,
        ..crate::model::Model::new(
            "two linears",
            g,
            crate::autodiff::optim::Optimizer::Sgd { lr: 0.1 },
        )
    };
    pipeline::compile(&m, &pipeline::Options::for_target(Target::Cuda)).unwrap()
}

fn program(c: &pipeline::Compiled) -> Program {
    match c.executable(Target::Cuda).unwrap().program() {
        crate::lower::Program::Cuda(p) => p.clone(),
        crate::lower::Program::Cpu(_) => unreachable!("a CUDA step"),
    }
}

/// The node of parameter `name`.
fn parameter(g: &Graph, name: &str) -> NodeId {
    g.ids()
        .find(|&id| matches!(&g.node(id).op, Op::Leaf { name: n, .. } if n == name))
        .unwrap_or_else(|| panic!("no parameter {name}"))
}

#[test]
fn the_first_layers_bias_rides_on_its_gemm_and_its_kernel_launches_only_as_the_fallback() {
    for precision in [Precision::F32, Precision::Tf32] {
        let c = two_linears(precision);
        let p = program(&c);
        let with: Vec<_> = p
            .ops
            .iter()
            .filter_map(|op| match op {
                DeviceOp::Gemm(gm) => gm.epilogue.as_ref().map(|e| (gm, e)),
                _ => None,
            })
            .collect();
        let [(gm, e)] = with[..] else {
            panic!(
                "{precision:?}: {} GEMMs with an epilogue, not 1",
                with.len()
            );
        };
        let bias = parameter(&c.graph, "a.bias");
        let loc = c.plan.location(&c.graph, bias);
        assert_eq!(e.bias, loc.offset, "{precision:?}: the bias is a.bias");
        assert_eq!(e.bias_dtype, DType::F32);
        assert_eq!(gm.m, 48, "{precision:?}: one bias value a column");
        // The absorbed kernel launches nowhere else, and its fallback reads the product and
        // the bias and writes over the product.
        assert!(
            !p.ops.iter().any(|op| op.node() == Some(e.node)),
            "{precision:?}: the absorbed kernel still launches"
        );
        assert_eq!(e.args.as_slice(), &[gm.out, e.bias, gm.out]);
        // The GEMM's touch holds the bias, so its writer and readers are ordered with it.
        let i = p
            .ops
            .iter()
            .position(|op| op.node() == Some(gm.node))
            .unwrap();
        assert!(p.touches[i].reads.contains(&loc));
        deps::check(&p.touches, &p.deps).unwrap();
        p.check(c.plan.total_bytes).unwrap();
    }
}

#[test]
fn under_bf16_the_f32_bias_keeps_its_kernel_as_cublaslt_refuses_an_f32_bias_on_bf16() {
    let p = program(&two_linears(Precision::Bf16));
    let gemms: Vec<_> = p
        .ops
        .iter()
        .filter_map(|op| match op {
            DeviceOp::Gemm(gm) => Some(gm),
            _ => None,
        })
        .collect();
    assert!(!gemms.is_empty());
    assert!(gemms.iter().all(|gm| gm.epilogue.is_none()));
}

#[test]
fn every_absorbed_kernel_wrote_over_its_products_own_bytes() {
    let c = two_linears(Precision::F32);
    let p = program(&c);
    for op in &p.ops {
        let DeviceOp::Gemm(gm) = op else { continue };
        let Some(e) = &gm.epilogue else { continue };
        let (g, outs) = (&c.graph, c.graph.kernel_outputs());
        // The rule's condition, checked here on the plan: the kernel's output is the
        // product's own bytes.
        let out = outs[e.node.index()][0];
        assert_eq!(c.plan.location(g, out), c.plan.location(g, gm.node));
    }
}

#[test]
fn two_lowerings_of_a_step_with_epilogues_are_the_same() {
    let c = two_linears(Precision::Tf32);
    assert_eq!(program(&c), program(&c));
}
