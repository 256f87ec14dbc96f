//! Fixed fused kernels that tests in and outside this crate build alike: written once here so
//! that the CPU executor's own unit tests and the integration tests hold the same kernel.

use super::{Access, FusedKernel, Input, Inst, Output};
use crate::{BinaryOp, DType, ReduceOp};

/// `x * 0.75 + 0.5`, `ops` times in turn (a multiply, then an add, ...), over `f32[dims]`: one
/// constant each, read by every step, as fusion's deduplicated constants are; then, when
/// `reduce`, also the max of each row of the innermost axis as a second output.
pub fn chain(ops: usize, dims: &[usize], reduce: bool) -> FusedKernel {
    let len: usize = dims.iter().product();
    let mut body = vec![
        Inst::Load { input: 0 },
        Inst::Const {
            value: 0.75,
            dtype: DType::F32,
        },
        Inst::Const {
            value: 0.5,
            dtype: DType::F32,
        },
    ];
    let mut v = 0;
    for o in 0..ops {
        let (op, c) = if o % 2 == 0 {
            (BinaryOp::Mul, 1)
        } else {
            (BinaryOp::Add, 2)
        };
        body.push(Inst::Binary { op, a: v, b: c });
        v = body.len() - 1;
    }
    let mut outputs = vec![Output { value: v }];
    if reduce {
        body.push(Inst::Reduce {
            op: ReduceOp::Max,
            x: v,
        });
        outputs.push(Output {
            value: body.len() - 1,
        });
    }
    FusedKernel {
        domain: dims.to_vec(),
        reduce_axes: if reduce { vec![dims.len() - 1] } else { vec![] },
        inputs: vec![Input {
            dtype: DType::F32,
            len,
            access: Access::contiguous(dims),
        }],
        body,
        outputs,
    }
}
