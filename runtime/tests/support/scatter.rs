//! For the reduce-scatter tests (`#[path]`-included): a step built by hand around a
//! reduce-scatter and an all-reduce of the same inputs over two ranks, and each rank's inputs.
#![allow(dead_code)]

use ingot_compiler::autodiff::Step;
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::{DType, Graph, NodeId, Op, TensorType};
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Options};
use ingot_runtime::tensor::Tensor;

pub const RANKS: usize = 2;

/// `op` over `operands`, its outputs (the node, then a result node per further operand).
fn collective(g: &mut Graph, op: Op, operands: &[NodeId]) -> Vec<NodeId> {
    let first = g.push(op.clone(), operands, None).unwrap();
    let mut outs = vec![first];
    for (i, &x) in operands.iter().enumerate().skip(1) {
        let mut ty: TensorType = g.ty(x).clone();
        if let Op::ReduceScatter { ranks } = op {
            let mut d = ty.shape.dims().to_vec();
            d[0] /= ranks;
            ty.shape = d.as_slice().into();
        }
        outs.push(g.push(Op::Result { index: i }, &[first], Some(ty)).unwrap());
    }
    outs
}

/// A step with inputs `x0, x1, ..` of `shapes` and `dtype`, their reduce-scatter as outputs
/// `s0, s1, ..` and their all-reduce as outputs `a0, a1, ..`, compiled for `target`.
pub fn step(shapes: &[&[usize]], dtype: DType, target: Target) -> Executable {
    let mut g = Graph::new();
    let xs: Vec<NodeId> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| g.input(&format!("x{i}"), *s, dtype).unwrap())
        .collect();
    let scattered = collective(&mut g, Op::ReduceScatter { ranks: RANKS }, &xs);
    let reduced = collective(&mut g, Op::AllReduce { ranks: RANKS }, &xs);
    for (i, (&s, &a)) in scattered.iter().zip(&reduced).enumerate() {
        g.set_output(&format!("s{i}"), s).unwrap();
        g.set_output(&format!("a{i}"), a).unwrap();
    }
    let opts = Options::for_target(target);
    pipeline::compile_step("reduce_scatter", Step::forward_only(g), &opts)
        .unwrap()
        .executable(target)
        .unwrap()
}

/// Rank `r`'s value of input `i` (`n` elements): different on every rank, and inexact in
/// binary so that the sum rounds.
pub fn value(r: usize, i: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|e| {
            ((e + 1) as f32 * 0.1 + i as f32) * if r == 0 { 1.0 } else { -0.37 } + r as f32 / 3.0
        })
        .collect()
}

/// Rank `r`'s input `i` of `dims` and `dtype` ([`value`]).
pub fn input(r: usize, i: usize, dims: &[usize], dtype: DType) -> Tensor {
    let v = value(r, i, dims.iter().product());
    match dtype {
        DType::BF16 => Tensor::from_f32_as_bf16(dims, &v),
        _ => Tensor::from_f32(dims, v),
    }
}

/// Checks each rank's outputs (`out[r]`, little-endian bytes by name): its `s{i}` is rows
/// `r·n/R .. (r+1)·n/R` of its `a{i}`, bit for bit, for each operand of `shapes`; and in f32
/// the all-reduce is `x0 + x1` on every rank (each rank's gradients are of its share of the
/// loss, so the sum is their mean).
pub fn check_rows(shapes: &[&[usize]], dtype: DType, out: &[indexmap::IndexMap<String, Vec<u8>>]) {
    for (i, s) in shapes.iter().enumerate() {
        let n: usize = s.iter().product();
        if dtype == DType::F32 {
            let want: Vec<u8> = (0..n)
                .map(|e| value(0, i, n)[e] + value(1, i, n)[e])
                .flat_map(f32::to_le_bytes)
                .collect();
            for o in out {
                assert_eq!(
                    o[&format!("a{i}")],
                    want,
                    "the all-reduce of x{i} is the sum"
                );
            }
        }
        for (r, o) in out.iter().enumerate() {
            let all = &o[&format!("a{i}")];
            let part = all.len() / RANKS;
            assert_eq!(
                o[&format!("s{i}")],
                all[r * part..(r + 1) * part],
                "rank {r}'s reduce-scatter of x{i} {s:?} ({dtype}) is its rows of the all-reduce"
            );
        }
    }
}
