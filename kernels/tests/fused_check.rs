//! `FusedKernel::check` rejects each kind of malformed kernel with an error that names the
//! place (instruction, input, output) and what is wrong; `cpu::run` rejects bad buffers.

use ingot_kernels::fused::{cpu, FusedKernel, Inst, KernelError, Output};
use ingot_kernels::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use ingot_testkit::fused_kernels::softmax_rows;

/// softmax over [4, 8]: valid, and the base the broken kernels start from.
fn good() -> FusedKernel {
    softmax_rows(4, 8)
}

fn with(f: impl FnOnce(&mut FusedKernel)) -> KernelError {
    let mut k = good();
    f(&mut k);
    k.check().expect_err("a malformed kernel checked")
}

/// The error is `want`, and its message mentions each of `words`.
fn rejects(err: KernelError, want: KernelError, words: &[&str]) {
    let msg = err.to_string();
    assert_eq!(err, want, "{msg}");
    for w in words {
        assert!(msg.contains(w), "`{msg}` does not mention `{w}`");
    }
}

#[test]
fn the_base_kernel_checks() {
    good().check().unwrap();
}

#[test]
fn reduce_axes_must_be_sorted_distinct_and_in_range() {
    for axes in [vec![1, 0], vec![1, 1], vec![2]] {
        let e = with(|k| k.reduce_axes = axes.clone());
        rejects(
            e,
            KernelError::ReduceAxes {
                axes: axes.clone(),
                rank: 2,
            },
            &["reduce axes", "rank 2"],
        );
    }
}

#[test]
fn a_domain_too_large_to_count_is_rejected() {
    let e = with(|k| {
        k.domain = vec![usize::MAX, 3];
        k.inputs[0].access.strides = vec![0, 0];
    });
    assert!(matches!(e, KernelError::DomainTooLarge { .. }), "{e}");
}

#[test]
fn an_access_needs_one_stride_per_axis() {
    let e = with(|k| k.inputs[0].access.strides = vec![1]);
    rejects(
        e,
        KernelError::StrideCount {
            input: 0,
            strides: 1,
            rank: 2,
        },
        &["input 0", "1 strides", "2 axes"],
    );
}

#[test]
fn an_access_must_stay_inside_its_input() {
    let e = with(|k| k.inputs[0].access.offset = 1);
    assert!(
        matches!(
            e,
            KernelError::AccessOutOfBounds {
                input: 0,
                len: 32,
                reach: 32,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("input 0") && e.to_string().contains("32"),
        "{e}"
    );
    // Transposed strides that overrun.
    let e = with(|k| k.inputs[0].access.strides = vec![1, 8]);
    assert!(
        matches!(e, KernelError::AccessOutOfBounds { reach: 59, .. }),
        "{e}"
    );
    // An empty domain reads nothing...
    let mut k = good();
    k.domain = vec![0, 8];
    k.inputs[0].len = 0;
    k.check().unwrap();
    // ...except a row-level input, read once per row even when a reduce axis is empty.
    let mut k = good();
    k.domain = vec![4, 0];
    k.inputs[0].access.strides = vec![1, 0];
    k.inputs[0].len = 3;
    assert!(matches!(
        k.check(),
        Err(KernelError::AccessOutOfBounds { reach: 3, .. })
    ));
    k.inputs[0].len = 4;
    k.check().unwrap();
}

#[test]
fn operands_must_be_earlier_instructions() {
    let e = with(|k| k.body[2] = Inst::binary(BinaryOp::Sub, 0, 2));
    rejects(
        e,
        KernelError::Operand {
            inst: 2,
            operand: 2,
        },
        &["%2", "not an earlier"],
    );
    let e = with(|k| {
        k.body[5] = Inst::Select {
            cond: 1,
            a: 3,
            b: 99,
        }
    });
    rejects(
        e,
        KernelError::Operand {
            inst: 5,
            operand: 99,
        },
        &["%5", "%99"],
    );
}

#[test]
fn a_load_must_name_an_input() {
    let e = with(|k| k.body[0] = Inst::Load { input: 1 });
    rejects(
        e,
        KernelError::NoSuchInput {
            inst: 0,
            input: 1,
            inputs: 1,
        },
        &["%0", "input 1"],
    );
}

#[test]
fn an_index_must_name_an_axis() {
    let e = with(|k| {
        k.body.push(Inst::Index {
            axis: 2,
            dtype: DType::I32,
        })
    });
    rejects(
        e,
        KernelError::IndexAxis {
            inst: 6,
            axis: 2,
            rank: 2,
        },
        &["%6", "axis 2"],
    );
}

#[test]
fn dtype_rules_are_enforced_per_instruction() {
    let push = |insts: Vec<Inst>| {
        with(move |k| {
            k.body.push(Inst::Const {
                value: 1.0,
                dtype: DType::I32,
            }); // %6
            k.body.push(Inst::Compare {
                op: CmpOp::Lt,
                a: 0,
                b: 0,
            }); // %7 bool
            k.body.push(Inst::Const {
                value: 1.0,
                dtype: DType::F64,
            }); // %8
            k.body.extend(insts); // %9...
        })
    };
    use KernelError::*;
    rejects(
        push(vec![Inst::binary(BinaryOp::Add, 0, 8)]),
        OperandDtypes {
            inst: 9,
            op: "add",
            a: DType::F32,
            b: DType::F64,
        },
        &["%9", "add", "f32", "f64"],
    );
    rejects(
        push(vec![Inst::binary(BinaryOp::Div, 6, 6)]),
        NotDefined {
            inst: 9,
            op: "div",
            dtype: DType::I32,
        },
        &["%9", "div", "i32"],
    );
    rejects(
        push(vec![Inst::binary(BinaryOp::Max, 7, 7)]),
        NotDefined {
            inst: 9,
            op: "max",
            dtype: DType::Bool,
        },
        &["bool"],
    );
    rejects(
        push(vec![Inst::unary(UnaryOp::Exp, 6)]),
        NotDefined {
            inst: 9,
            op: "exp",
            dtype: DType::I32,
        },
        &["exp", "i32"],
    );
    rejects(
        push(vec![Inst::unary(UnaryOp::Neg, 7)]),
        NotDefined {
            inst: 9,
            op: "neg",
            dtype: DType::Bool,
        },
        &["neg", "bool"],
    );
    rejects(
        push(vec![Inst::Compare {
            op: CmpOp::Eq,
            a: 6,
            b: 8,
        }]),
        OperandDtypes {
            inst: 9,
            op: "eq",
            a: DType::I32,
            b: DType::F64,
        },
        &["eq"],
    );
    rejects(
        push(vec![Inst::Select {
            cond: 6,
            a: 0,
            b: 0,
        }]),
        SelectCondition {
            inst: 9,
            dtype: DType::I32,
        },
        &["%9", "condition", "i32"],
    );
    rejects(
        push(vec![Inst::Select {
            cond: 7,
            a: 0,
            b: 8,
        }]),
        OperandDtypes {
            inst: 9,
            op: "select",
            a: DType::F32,
            b: DType::F64,
        },
        &["select"],
    );
    rejects(
        push(vec![Inst::Reduce {
            op: ReduceOp::Sum,
            x: 7,
        }]),
        NotDefined {
            inst: 9,
            op: "reduce_sum",
            dtype: DType::Bool,
        },
        &["reduce_sum", "bool"],
    );
    // What is allowed: neg of an integer, compare of bools, select of bools, any convert.
    let mut k = good();
    k.body.push(Inst::Const {
        value: 1.0,
        dtype: DType::I64,
    }); // 6
    k.body.push(Inst::unary(UnaryOp::Neg, 6)); // 7
    k.body.push(Inst::Compare {
        op: CmpOp::Lt,
        a: 0,
        b: 0,
    }); // 8
    k.body.push(Inst::Compare {
        op: CmpOp::Ne,
        a: 8,
        b: 8,
    }); // 9
    k.body.push(Inst::Select {
        cond: 9,
        a: 8,
        b: 9,
    }); // 10
    k.body.push(Inst::Convert {
        x: 10,
        to: DType::F64,
    }); // 11
    k.body.push(Inst::Reduce {
        op: ReduceOp::Max,
        x: 7,
    }); // 12
    k.check().unwrap();
    assert_eq!(k.dtype_of(10), DType::Bool);
    assert_eq!(k.dtype_of(12), DType::I64);
}

#[test]
fn outputs_must_name_instructions() {
    let e = with(|k| k.outputs.push(Output { value: 6 }));
    rejects(
        e,
        KernelError::OutputValue {
            output: 1,
            value: 6,
            body: 6,
        },
        &["output 1", "%6"],
    );
}

#[test]
fn run_rejects_buffers_that_do_not_fit_and_wrong_counts() {
    let k = good();
    let sb = cpu::scratch_bytes(&k);
    let mut mem = vec![0u8; 1024 + sb];
    // Fits: input at 0, output at 256, scratch at 1024.
    cpu::run(&k, &mut mem, &[0], &[256], 1024).unwrap();
    let e = cpu::run(&k, &mut mem, &[0, 0], &[256], 1024).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::BufferCount {
                what: "inputs",
                expected: 1,
                given: 2
            }
        ),
        "{e}"
    );
    let e = cpu::run(&k, &mut mem, &[0], &[], 1024).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::BufferCount {
                what: "outputs",
                ..
            }
        ),
        "{e}"
    );
    let e = cpu::run(&k, &mut mem, &[1000], &[256], 1024).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::ScratchOverlap {
                what: "input",
                index: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = cpu::run(&k, &mut mem, &[0], &[1024 + 64], 1024).unwrap_err();
    assert!(
        matches!(e, KernelError::ScratchOverlap { what: "output", .. }),
        "{e}"
    );
    let e = cpu::run(&k, &mut mem, &[0], &[usize::MAX - 3], 1024).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::BufferOutOfRange {
                what: "output",
                index: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = cpu::run(&k, &mut mem, &[0], &[256], 1025).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::BufferOutOfRange {
                what: "scratch",
                ..
            }
        ),
        "{e}"
    );
    let e = cpu::run(&k, &mut mem[..100], &[0], &[256], 0).unwrap_err();
    assert!(matches!(e, KernelError::BufferOutOfRange { .. }), "{e}");
    let mut bad = good();
    bad.body[0] = Inst::Load { input: 3 };
    let e = cpu::run(&bad, &mut mem, &[0], &[256], 1024).unwrap_err();
    assert!(matches!(e, KernelError::NoSuchInput { .. }), "{e}");
}
