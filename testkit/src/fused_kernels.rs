//! Fused kernels the kernel tests and benchmarks build by hand (a softmax and a layer norm over
//! rows of f32), one copy for the checks of `FusedKernel::check`, the compiled kernels' tests and
//! the `fused_speed` benchmark.

use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::{BinaryOp, DType, ReduceOp, UnaryOp};

/// An f32 input read over `domain` by `strides` from offset 0, as long as that access needs.
pub fn strided_input(domain: &[usize], strides: &[usize]) -> Input {
    let len = 1 + domain
        .iter()
        .zip(strides)
        .map(|(&d, &s)| s * (d - 1))
        .sum::<usize>();
    Input {
        dtype: DType::F32,
        len,
        access: Access {
            offset: 0,
            strides: strides.to_vec(),
        },
    }
}

/// `a op b` of two earlier instructions.
pub fn bin(op: BinaryOp, a: usize, b: usize) -> Inst {
    Inst::Binary { op, a, b }
}

/// An f32 constant.
pub fn f32_const(value: f64) -> Inst {
    Inst::Const {
        value,
        dtype: DType::F32,
    }
}

/// Softmax over each of the `rows` rows of `n` f32s of a contiguous `[rows, n]` input: the max
/// subtracted, `exp`, divided by the row's sum.
pub fn softmax_rows(rows: usize, n: usize) -> FusedKernel {
    FusedKernel {
        domain: vec![rows, n],
        reduce_axes: vec![1],
        inputs: vec![strided_input(&[rows, n], &[n, 1])],
        body: vec![
            Inst::Load { input: 0 },
            Inst::Reduce {
                op: ReduceOp::Max,
                x: 0,
            },
            bin(BinaryOp::Sub, 0, 1),
            Inst::unary(UnaryOp::Exp, 2),
            Inst::Reduce {
                op: ReduceOp::Sum,
                x: 3,
            },
            bin(BinaryOp::Div, 3, 4),
        ],
        outputs: vec![Output { value: 5 }],
    }
}

/// Layer norm over each of the `rows` rows of `n` f32s, as the compiler fuses it:
/// `mean = Σx · (1/n)`, `var = Σ(x − mean)² · (1/n)`, `rstd = 1/√(var + 1e-5)`,
/// `y = (x − mean) · rstd · w`, plus `b` where `bias`. Inputs x `[rows, n]`, w `[n]` and, where
/// `bias`, b `[n]`; outputs y and, where `stats`, the row-level mean and rstd after it.
pub fn layer_norm(rows: usize, n: usize, bias: bool, stats: bool) -> FusedKernel {
    let row_vector = || strided_input(&[rows, n], &[0, 1]);
    let mut inputs = vec![strided_input(&[rows, n], &[n, 1]), row_vector()];
    let mut body = vec![
        Inst::Load { input: 0 }, // 0 x
        Inst::Reduce {
            op: ReduceOp::Sum,
            x: 0,
        }, // 1
        f32_const(1.0 / n as f64), // 2
        bin(BinaryOp::Mul, 1, 2), // 3 mean
        bin(BinaryOp::Sub, 0, 3), // 4 d
        bin(BinaryOp::Mul, 4, 4), // 5
        Inst::Reduce {
            op: ReduceOp::Sum,
            x: 5,
        }, // 6
        bin(BinaryOp::Mul, 6, 2), // 7 var
        f32_const(1e-5),         // 8
        bin(BinaryOp::Add, 7, 8), // 9
        Inst::unary(UnaryOp::Sqrt, 9), // 10
        Inst::unary(UnaryOp::Recip, 10), // 11 rstd
        bin(BinaryOp::Mul, 4, 11), // 12
        Inst::Load { input: 1 }, // 13 w
        bin(BinaryOp::Mul, 12, 13), // 14 y
    ];
    if bias {
        inputs.push(row_vector());
        body.push(Inst::Load { input: 2 }); // 15 b
        body.push(bin(BinaryOp::Add, 14, 15)); // 16 y + b
    }
    let mut outputs = vec![Output {
        value: body.len() - 1,
    }];
    if stats {
        outputs.extend([Output { value: 3 }, Output { value: 11 }]);
    }
    FusedKernel {
        domain: vec![rows, n],
        reduce_axes: vec![1],
        inputs,
        body,
        outputs,
    }
}
