//! Small fused kernels of the reduction tests, over a contiguous f32 input: `#[path]`-included
//! by the kernel tests and the runtime's GPU tests, each of which uses a part.
#![allow(dead_code)]

use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::{BinaryOp, DType, ReduceOp};

/// A contiguous f32 input shaped `dims`.
pub fn f32_input(dims: &[usize]) -> Input {
    Input {
        dtype: DType::F32,
        len: dims.iter().product(),
        access: Access::contiguous(dims),
    }
}

/// `sum` and `max` over `axes` of a contiguous f32 input shaped `dims`.
pub fn sum_and_max(dims: &[usize], axes: &[usize]) -> FusedKernel {
    let body = [
        Inst::Load { input: 0 },
        Inst::Reduce {
            op: ReduceOp::Sum,
            x: 0,
        },
        Inst::Reduce {
            op: ReduceOp::Max,
            x: 0,
        },
    ];
    over_f32_input(dims, axes, body, &[1, 2])
}

/// `max(x, 0)`, `min(x, 0)`, and the max over `axes` of value `of` of the body (0: `x`, 2:
/// `max(x, 0)`).
pub fn max_min_and_reduce_max(dims: &[usize], axes: &[usize], of: usize) -> FusedKernel {
    let body = [
        Inst::Load { input: 0 },
        Inst::Const {
            value: 0.0,
            dtype: DType::F32,
        },
        Inst::binary(BinaryOp::Max, 0, 1),
        Inst::binary(BinaryOp::Min, 0, 1),
        Inst::Reduce {
            op: ReduceOp::Max,
            x: of,
        },
    ];
    over_f32_input(dims, axes, body, &[2, 3, 4])
}

/// The kernel of `body` over the domain `dims`, reducing `axes`, with one contiguous f32 input
/// and the values `outputs` as its outputs.
fn over_f32_input<const N: usize>(
    dims: &[usize],
    axes: &[usize],
    body: [Inst; N],
    outputs: &[usize],
) -> FusedKernel {
    FusedKernel {
        domain: dims.to_vec(),
        reduce_axes: axes.to_vec(),
        inputs: vec![f32_input(dims)],
        body: body.to_vec(),
        outputs: outputs.iter().map(|&value| Output { value }).collect(),
    }
}
