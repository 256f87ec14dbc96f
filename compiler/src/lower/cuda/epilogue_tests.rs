//! The bias epilogue's rule ([`super::epilogue`]): which kernels are bias adds, and which
//! matmuls of a compiled step take theirs into the GEMM.

use super::epilogue::{bias_add, round_to_bf16, BiasAdd, ROUND_ROOM};
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
            bias: 1,
            product_as: DType::BF16,
            bias_as: DType::BF16,
            sum_as: DType::BF16,
        })
    );
    assert_eq!(
        bias_add(&bf16_bias_add(8, 6, true)),
        Some(BiasAdd {
            product: 1,
            bias: 0,
            product_as: DType::BF16,
            bias_as: DType::BF16,
            sum_as: DType::BF16,
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
        assert!(
            e.round.is_none(),
            "{precision:?}: the bias is read as it is"
        );
        assert_eq!(gm.library_workspace(), gm.workspace.bytes);
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
fn a_bias_add_says_where_its_values_are_rounded_to_bf16() {
    // The f32 bias added as it is (no rounding to bf16 on its way): an epilogue adding a
    // bf16 copy would change it.
    let mut k = bf16_bias_add(8, 6, false);
    k.body[3] = Inst::Convert {
        x: 2,
        to: DType::F32,
    };
    let ba = bias_add(&k).unwrap();
    assert_eq!(
        (ba.product_as, ba.bias_as, ba.sum_as),
        (DType::BF16, DType::F32, DType::BF16)
    );
    // All f32: nothing rounded.
    let mut k = bf16_bias_add(8, 6, false);
    k.inputs[0].dtype = DType::F32;
    for i in [1, 3, 4, 6] {
        let Inst::Convert { to, .. } = &mut k.body[i] else {
            unreachable!()
        };
        *to = DType::F32;
    }
    let ba = bias_add(&k).unwrap();
    assert_eq!(
        (ba.product_as, ba.bias_as, ba.sum_as),
        (DType::F32, DType::F32, DType::F32)
    );
}

#[test]
fn under_bf16_an_unrounded_f32_bias_keeps_its_kernel() {
    // The rule asks each value at the GEMM's precision; a bias the kernel adds in f32 to a
    // bf16 product is not one cuBLASLt's bf16 epilogue adds: refused (on the pattern, as the
    // fusion never writes it).
    let mut k = bf16_bias_add(8, 6, false);
    k.body[3] = Inst::Convert {
        x: 2,
        to: DType::F32,
    };
    assert_ne!(bias_add(&k).unwrap().bias_as, DType::BF16);
}

/// The one GEMM of a step that carries an epilogue.
fn the_epilogue(p: &Program) -> (&super::Gemm, &super::Epilogue) {
    let with: Vec<_> = p
        .ops
        .iter()
        .filter_map(|op| match op {
            DeviceOp::Gemm(gm) => gm.epilogue.as_ref().map(|e| (gm, e)),
            _ => None,
        })
        .collect();
    let [one] = with[..] else {
        panic!("{} GEMMs with an epilogue, not 1", with.len());
    };
    one
}

#[test]
fn under_bf16_the_f32_bias_is_rounded_into_its_gemms_workspace_tail_before_the_call() {
    let c = two_linears(Precision::Bf16);
    let p = program(&c);
    let (gm, e) = the_epilogue(&p);
    let bias = parameter(&c.graph, "a.bias");
    let loc = c.plan.location(&c.graph, bias);
    assert_eq!(loc.bytes, 48 * 4, "a.bias is the f32 parameter");
    let r = e.round.as_ref().expect("a rounding of the f32 bias");
    // The rounding reads the parameter and writes the bf16 copy the epilogue reads.
    assert_eq!(r.args.as_slice(), &[loc.offset, e.bias]);
    assert_eq!(e.bias_dtype, DType::BF16);
    // The copy is the workspace's last 256-aligned 96 bytes; the library keeps the rest.
    let ws = gm.workspace;
    assert_eq!(e.bias % 256, 0);
    assert!(e.bias + 48 * 2 <= ws.offset + ws.bytes);
    assert!(ws.offset + ws.bytes - e.bias < 256 + 48 * 2);
    assert_eq!(gm.library_workspace(), e.bias - ws.offset);
    assert!(gm.library_workspace() >= ROUND_ROOM);
    // The rounding kernel is the one a bias add's body rounds with.
    let want = ingot_kernels::cuda::fused(&round_to_bf16(48)).unwrap();
    assert_eq!(p.kernels[r.kernel].name, want.name);
    // The fallback is the absorbed kernel on the product and the f32 bias, which launches
    // nowhere else; the GEMM's touch reads the parameter and writes its workspace.
    assert_eq!(e.args.as_slice(), &[gm.out, loc.offset, gm.out]);
    assert!(!p.ops.iter().any(|op| op.node() == Some(e.node)));
    let i = p
        .ops
        .iter()
        .position(|op| op.node() == Some(gm.node))
        .unwrap();
    assert!(p.touches[i].reads.contains(&loc));
    assert!(p.touches[i].writes.contains(&ws));
    deps::check(&p.touches, &p.deps).unwrap();
    p.check(c.plan.total_bytes).unwrap();
}

#[test]
fn a_rounded_bias_outside_its_gemms_workspace_is_an_error_naming_the_matmul() {
    let c = two_linears(Precision::Bf16);
    let mut p = program(&c);
    for op in &mut p.ops {
        if let DeviceOp::Gemm(gm) = op {
            if let Some(e) = &mut gm.epilogue {
                e.bias = gm.workspace.offset + gm.workspace.bytes;
            }
        }
    }
    let err = p.check(c.plan.total_bytes).unwrap_err().to_string();
    assert!(err.contains("rounded bias"), "{err}");
}

#[test]
fn every_absorbed_kernel_wrote_over_its_products_own_bytes() {
    for precision in [Precision::F32, Precision::Bf16] {
        let c = two_linears(precision);
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
}

#[test]
fn two_lowerings_of_a_step_with_epilogues_are_the_same() {
    for precision in [Precision::Tf32, Precision::Bf16] {
        let c = two_linears(precision);
        assert_eq!(program(&c), program(&c));
    }
}
