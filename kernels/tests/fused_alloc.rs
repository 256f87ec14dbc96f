//! Invariant 3 for fused kernels: `fused::cpu::run` makes no heap allocation, for every shape of
//! iteration (flat elementwise, reductions along the last axis, reductions over leading axes),
//! several passes, every dtype, long bodies, and in place.
//!
//! A counting global allocator (support/counting.rs) counts the allocations of the calling
//! thread.

use ingot_kernels::fused::{cpu, Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
#[path = "support/counting.rs"]
mod counting;
use counting::allocations;

/// `x` through a chain of ops of every kind, reduced twice (two passes), with full and
/// row-level outputs of several dtypes.
fn kernel(domain: &[usize], reduce_axes: &[usize], extra: usize) -> FusedKernel {
    let rank = domain.len();
    let mut bcast = vec![0; rank];
    bcast[rank - 1] = 1;
    let numel: usize = domain.iter().product();
    let mut body = vec![
        Inst::Load { input: 0 },           // 0 x
        Inst::Load { input: 1 },           // 1 b (broadcast)
        Inst::binary(BinaryOp::Add, 0, 1), // 2
        Inst::Reduce {
            op: ReduceOp::Max,
            x: 2,
        }, // 3
        Inst::binary(BinaryOp::Sub, 2, 3), // 4
        Inst::unary(UnaryOp::Exp, 4),      // 5
        Inst::Reduce {
            op: ReduceOp::Sum,
            x: 5,
        }, // 6
        Inst::binary(BinaryOp::Div, 5, 6), // 7
        Inst::Index {
            axis: rank - 1,
            dtype: DType::I64,
        }, // 8
        Inst::Const {
            value: 3.0,
            dtype: DType::I64,
        }, // 9
        Inst::Compare {
            op: CmpOp::Lt,
            a: 8,
            b: 9,
        }, // 10
        Inst::Select {
            cond: 10,
            a: 7,
            b: 0,
        }, // 11
        Inst::Convert {
            x: 11,
            to: DType::F64,
        }, // 12
        Inst::Reduce {
            op: ReduceOp::Sum,
            x: 8,
        }, // 13 (i64)
    ];
    let mut last = 12;
    for _ in 0..extra {
        body.push(Inst::unary(UnaryOp::Tanh, last));
        last = body.len() - 1;
    }
    FusedKernel {
        domain: domain.to_vec(),
        reduce_axes: reduce_axes.to_vec(),
        inputs: vec![
            Input {
                dtype: DType::F32,
                len: numel,
                access: Access::contiguous(domain),
            },
            Input {
                dtype: DType::F32,
                len: domain[rank - 1],
                access: Access {
                    offset: 0,
                    strides: bcast,
                },
            },
        ],
        body,
        outputs: vec![
            Output { value: 11 },
            Output { value: last },
            Output { value: 6 },
            Output { value: 13 },
        ],
    }
}

#[test]
fn running_a_fused_kernel_allocates_nothing() {
    let cases: &[(&[usize], &[usize], usize)] = &[
        (&[64, 300], &[1], 0),
        (&[300, 40], &[0], 0),
        (&[4, 5, 70], &[0, 1], 0),
        (&[4, 5, 70], &[0, 2], 0),
        (&[1000], &[], 0),
        (&[3, 700], &[], 0),
        (&[16, 33], &[1], 200),
    ];
    for &(domain, axes, extra) in cases {
        let k = kernel(domain, axes, extra);
        k.check().unwrap();
        let mut mem = vec![0u8; 1 << 22];
        let numel: usize = domain.iter().product();
        let ins = [0, numel * 4 + 64];
        let outs = [ins[0], 1 << 20, 2 << 20, 3 << 20]; // output 0 over input 0
        assert!(k.can_write_over(0, 0));
        let scratch = 5 << 19;
        assert!(scratch + cpu::scratch_bytes(&k) < 3 << 20);
        for (i, b) in mem[..numel * 4].chunks_exact_mut(4).enumerate() {
            b.copy_from_slice(&((i % 17) as f32 * 0.25).to_ne_bytes());
        }
        cpu::run(&k, &mut mem, &ins, &outs, scratch).unwrap();
        let n = allocations(|| {
            for _ in 0..3 {
                cpu::run(&k, &mut mem, &ins, &outs, scratch).unwrap();
            }
        });
        assert_eq!(n, 0, "{domain:?} over {axes:?}: {n} allocations");
    }
}
