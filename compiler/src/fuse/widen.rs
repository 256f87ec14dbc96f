//! bf16 arithmetic inside a fused kernel is computed in f32 and rounded once, where it leaves
//! the kernel.
//!
//! The IR types every op of an autocast region bf16, and op by op that means a rounding after
//! each one. Inside a fused kernel those intermediates never reach memory, so the roundings buy
//! nothing but error and time: a GELU and its gradient are some thirty ops, and rounding each
//! made those kernels compute-bound (four times slower than their memory traffic on an H100).
//! PyTorch's generated kernels do what this pass does: load bf16, compute in f32, round at the
//! store. The IR's bf16 ops thus mean "stored as bf16": a value is rounded where it is written
//! to a buffer, or where the step converts it explicitly (a cast is kept as a rounding).
//!
//! The pass rewrites one kernel's body, so the CPU executor and the CUDA generator, which both
//! read that body, compute the same thing; f32 kernels come back unchanged (the same value,
//! bit for bit).
//!
//! Per instruction of the old body, with bf16 values replaced by f32 ones:
//! - a load of a bf16 input is followed by a conversion to f32;
//! - a bf16 constant is the f32 constant of the same value (rounded to f32, not to bf16);
//! - a bf16 index and a conversion to bf16 keep their rounding: the f32 value of the rounded
//!   bf16 (a convert to bf16 and back);
//! - arithmetic, select and reduce take their dtype from their operands, so they become f32 by
//!   themselves;
//! - a conversion out of bf16 (to f32, f64, an integer or bool) and a compare of bf16 values
//!   round their bf16 operand first, so that a value that leaves bf16 is the value the step
//!   stores, wherever it is computed: a kernel that recomputes a bf16 value and one that reads
//!   it stored then see the same number. Without it, `reduce_max`'s gradient, which counts the
//!   elements equal to the max (`x == max`), recomputed `convert<f32>(tanh(x))` unrounded in
//!   one kernel and compared it with the max another kernel had taken over the stored, rounded
//!   values: nothing was equal, the count was 0 and the gradient NaN (random step 36447, with
//!   two micro-batches). A value that holds a bf16 exactly already (a load of a bf16 input, a
//!   rounding) is not rounded again, so the common case, a stored bf16 widened, costs nothing;
//! - an output whose value was bf16 stores that value converted to bf16, and the rest of the
//!   kernel reads it rounded so: a kernel that stored `e = exp(...)` and went on to take the
//!   max of `sqrt(e * e + 1)` over the unrounded `e` found a max that the gradient's kernel,
//!   recomputing `sqrt(e * e + 1)` from the stored `e`, matched nowhere (random step 1074914:
//!   `reduce_max`'s gradient divided by a count of 0, NaN).

use ingot_kernels::fused::{FusedKernel, Inst, Output};
use ingot_kernels::DType;

/// `k` with its bf16 arithmetic done in f32 (see the module docs); `k` itself when it has no
/// bf16 instruction.
pub fn bf16_arithmetic_in_f32(k: &FusedKernel) -> FusedKernel {
    bf16_arithmetic_in_f32_keeping(k, &[])
}

/// As [`bf16_arithmetic_in_f32`], the bf16 values of instructions `unstored` also read rounded
/// by the rest of the kernel, as if it stored them: values whose store fusion dropped because
/// nothing else loads them (`fuse::unread`), so that dropping a store changes no value.
pub fn bf16_arithmetic_in_f32_keeping(k: &FusedKernel, unstored: &[usize]) -> FusedKernel {
    let dtypes = k.dtypes();
    if !dtypes.contains(&DType::BF16) {
        return k.clone();
    }
    let mut body: Vec<Inst> = Vec::with_capacity(k.body.len() + 8);
    // new[i]: the instruction of the new body holding old instruction i's value (as f32 where
    // the old value was bf16).
    let mut new: Vec<usize> = Vec::with_capacity(k.body.len());
    let push = |body: &mut Vec<Inst>, inst: Inst| {
        body.push(inst);
        body.len() - 1
    };
    // The old instructions whose bf16 value the kernel stores and reads again.
    let read: Vec<std::cell::Cell<bool>> = vec![Default::default(); k.body.len()];
    for inst in &k.body {
        remap(inst.clone(), |j| {
            read[j].set(true);
            j
        });
    }
    let mut stored = vec![false; k.body.len()];
    for v in k
        .outputs
        .iter()
        .map(|o| o.value)
        .chain(unstored.iter().copied())
    {
        stored[v] = dtypes[v] == DType::BF16 && read[v].get();
    }
    for (i, inst) in k.body.iter().enumerate() {
        let at = |j: usize| new[j];
        let v = match (inst.clone(), dtypes[i]) {
            (Inst::Load { input }, DType::BF16) => {
                let l = push(&mut body, Inst::Load { input });
                push(
                    &mut body,
                    Inst::Convert {
                        x: l,
                        to: DType::F32,
                    },
                )
            }
            (Inst::Const { value, .. }, DType::BF16) => push(
                &mut body,
                Inst::Const {
                    value,
                    dtype: DType::F32,
                },
            ),
            (Inst::Index { axis, .. }, DType::BF16) => {
                let x = push(
                    &mut body,
                    Inst::Index {
                        axis,
                        dtype: DType::BF16,
                    },
                );
                push(&mut body, Inst::Convert { x, to: DType::F32 })
            }
            (Inst::Convert { x, to: DType::BF16 }, _) => {
                let r = push(
                    &mut body,
                    Inst::Convert {
                        x: at(x),
                        to: DType::BF16,
                    },
                );
                push(
                    &mut body,
                    Inst::Convert {
                        x: r,
                        to: DType::F32,
                    },
                )
            }
            (Inst::Compare { op, a, b }, _) if dtypes[a] == DType::BF16 => {
                let (a, b) = (rounded(&mut body, at(a)), rounded(&mut body, at(b)));
                push(&mut body, Inst::Compare { op, a, b })
            }
            (Inst::Convert { x, to }, _) if dtypes[x] == DType::BF16 => {
                let x = rounded(&mut body, at(x));
                match to {
                    // The rounded value is that f32 already.
                    DType::F32 => x,
                    _ => push(&mut body, Inst::Convert { x, to }),
                }
            }
            (inst, _) => push(&mut body, remap(inst, at)),
        };
        // A value the kernel stores is that stored value for the rest of the kernel too (the
        // output then stores the rounding; one read by nothing else is rounded there).
        let v = if stored[i] { rounded(&mut body, v) } else { v };
        new.push(v);
    }
    let outputs = k
        .outputs
        .iter()
        .map(|o| {
            let v = new[o.value];
            if dtypes[o.value] != DType::BF16 {
                return Output { value: v };
            }
            // A rounded value (a convert to bf16 and back) stores its bf16 directly.
            let value = bf16_source(&body, v).unwrap_or_else(|| {
                push(
                    &mut body,
                    Inst::Convert {
                        x: v,
                        to: DType::BF16,
                    },
                )
            });
            Output { value }
        })
        .collect();
    FusedKernel {
        domain: k.domain.clone(),
        reduce_axes: k.reduce_axes.clone(),
        inputs: k.inputs.clone(),
        body,
        outputs,
    }
}

/// The bf16 instruction whose widening `v` is, when `v` is the f32 value of a bf16 one (a load
/// of a bf16 input, a conversion to bf16 or a bf16 index, converted to f32): such a `v` holds a
/// bf16 value exactly.
fn bf16_source(body: &[Inst], v: usize) -> Option<usize> {
    match body[v] {
        Inst::Convert { x, to: DType::F32 }
            if matches!(
                body[x],
                Inst::Load { .. }
                    | Inst::Convert {
                        to: DType::BF16,
                        ..
                    }
                    | Inst::Index {
                        dtype: DType::BF16,
                        ..
                    }
            ) =>
        {
            Some(x)
        }
        _ => None,
    }
}

/// `v`, an f32 instruction standing for a bf16 value, rounded to bf16 (and widened back): `v`
/// itself where it holds a bf16 value exactly already.
fn rounded(body: &mut Vec<Inst>, v: usize) -> usize {
    if bf16_source(body, v).is_some() {
        return v;
    }
    body.push(Inst::Convert {
        x: v,
        to: DType::BF16,
    });
    body.push(Inst::Convert {
        x: body.len() - 1,
        to: DType::F32,
    });
    body.len() - 1
}

/// `inst` with its operands renumbered by `at`.
pub(super) fn remap(inst: Inst, at: impl Fn(usize) -> usize) -> Inst {
    match inst {
        Inst::Load { .. } | Inst::Const { .. } | Inst::Index { .. } => inst,
        Inst::Unary { op, x } => Inst::Unary { op, x: at(x) },
        Inst::Binary { op, a, b } => Inst::Binary {
            op,
            a: at(a),
            b: at(b),
        },
        Inst::Compare { op, a, b } => Inst::Compare {
            op,
            a: at(a),
            b: at(b),
        },
        Inst::Select { cond, a, b } => Inst::Select {
            cond: at(cond),
            a: at(a),
            b: at(b),
        },
        Inst::Convert { x, to } => Inst::Convert { x: at(x), to },
        Inst::Reduce { op, x } => Inst::Reduce { op, x: at(x) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_kernels::dtype::{quantize_bf16, round_bf16};
    use ingot_kernels::fused::{Access, Input};
    use ingot_kernels::{BinaryOp, UnaryOp};

    fn input(dtype: DType, n: usize) -> Input {
        Input {
            dtype,
            len: n,
            access: Access::contiguous(&[n]),
        }
    }

    /// `tanh(x * 0.7978845608) + x`, over one input of dtype `d`.
    fn chain(d: DType) -> FusedKernel {
        FusedKernel {
            domain: vec![4],
            reduce_axes: vec![],
            inputs: vec![input(d, 4)],
            body: vec![
                Inst::Load { input: 0 },
                Inst::Const {
                    value: 0.7978845608028654,
                    dtype: d,
                },
                Inst::Binary {
                    op: BinaryOp::Mul,
                    a: 0,
                    b: 1,
                },
                Inst::Unary {
                    op: UnaryOp::Tanh,
                    x: 2,
                },
                Inst::Binary {
                    op: BinaryOp::Add,
                    a: 3,
                    b: 0,
                },
            ],
            outputs: vec![Output { value: 4 }],
        }
    }

    #[test]
    fn an_f32_kernel_comes_back_unchanged() {
        let k = chain(DType::F32);
        assert_eq!(bf16_arithmetic_in_f32(&k), k);
    }

    #[test]
    fn a_bf16_chain_computes_in_f32_and_rounds_once_at_the_store() {
        let k = bf16_arithmetic_in_f32(&chain(DType::BF16));
        k.check().unwrap();
        let d = k.dtypes();
        // Only the load and the stored value are bf16; every op in between is f32.
        let bf16: Vec<usize> = (0..d.len()).filter(|&i| d[i] == DType::BF16).collect();
        assert_eq!(bf16, vec![0, k.body.len() - 1]);
        assert_eq!(k.output_dtypes(), vec![DType::BF16]);
        assert!(matches!(
            k.body[1],
            Inst::Convert {
                x: 0,
                to: DType::F32
            }
        ));
        assert!(k
            .body
            .iter()
            .any(|i| matches!(i, Inst::Const { dtype: DType::F32, value } if *value == 0.7978845608028654)));
    }

    #[test]
    fn an_explicit_cast_to_bf16_inside_a_kernel_still_rounds() {
        // f32 input -> convert to bf16 -> mul by itself -> output (bf16).
        let k = FusedKernel {
            domain: vec![4],
            reduce_axes: vec![],
            inputs: vec![input(DType::F32, 4)],
            body: vec![
                Inst::Load { input: 0 },
                Inst::Convert {
                    x: 0,
                    to: DType::BF16,
                },
                Inst::Binary {
                    op: BinaryOp::Mul,
                    a: 1,
                    b: 1,
                },
            ],
            outputs: vec![Output { value: 2 }],
        };
        let w = bf16_arithmetic_in_f32(&k);
        w.check().unwrap();
        // load, round (to bf16 and back), mul in f32, store as bf16.
        assert!(matches!(
            w.body[1],
            Inst::Convert {
                x: 0,
                to: DType::BF16
            }
        ));
        assert!(matches!(
            w.body[2],
            Inst::Convert {
                x: 1,
                to: DType::F32
            }
        ));
        assert!(matches!(w.body[3], Inst::Binary { a: 2, b: 2, .. }));
        assert_eq!(w.output_dtypes(), vec![DType::BF16]);
    }

    #[test]
    fn a_stored_load_or_cast_is_stored_without_a_second_conversion() {
        let k = FusedKernel {
            domain: vec![4],
            reduce_axes: vec![],
            inputs: vec![input(DType::BF16, 4), input(DType::F32, 4)],
            body: vec![
                Inst::Load { input: 0 },
                Inst::Load { input: 1 },
                Inst::Convert {
                    x: 1,
                    to: DType::BF16,
                },
            ],
            outputs: vec![Output { value: 0 }, Output { value: 2 }],
        };
        let w = bf16_arithmetic_in_f32(&k);
        w.check().unwrap();
        assert_eq!(w.output_dtypes(), vec![DType::BF16, DType::BF16]);
        assert!(matches!(
            w.body[w.outputs[0].value],
            Inst::Load { input: 0 }
        ));
        assert!(matches!(
            w.body[w.outputs[1].value],
            Inst::Convert {
                to: DType::BF16,
                ..
            }
        ));
        // Nothing was appended for either output.
        assert_eq!(w.body.len(), 5);
    }

    /// `tanh(x)` of a bf16 input, computed in the kernel and then taken out of bf16 by `op`
    /// (`to`: a conversion to that dtype; `None`: compared for equality with input 1).
    fn tanh_leaving_bf16(to: Option<DType>) -> FusedKernel {
        let mut body = vec![
            Inst::Load { input: 0 },
            Inst::Unary {
                op: UnaryOp::Tanh,
                x: 0,
            },
        ];
        let inputs = match to {
            Some(to) => {
                body.push(Inst::Convert { x: 1, to });
                vec![input(DType::BF16, 4)]
            }
            None => {
                body.push(Inst::Load { input: 1 });
                body.push(Inst::Compare {
                    op: ingot_kernels::CmpOp::Eq,
                    a: 1,
                    b: 2,
                });
                vec![input(DType::BF16, 4), input(DType::BF16, 4)]
            }
        };
        let value = body.len() - 1;
        FusedKernel {
            domain: vec![4],
            reduce_axes: vec![],
            inputs,
            body,
            outputs: vec![Output { value }],
        }
    }

    fn bf16_bytes(xs: &[f32]) -> Vec<u8> {
        xs.iter()
            .flat_map(|&x| round_bf16(x).to_bits().to_le_bytes())
            .collect()
    }

    /// e = exp(x), y = e * e + 1 over four bf16 values, both stored.
    fn exp_then_square() -> FusedKernel {
        FusedKernel {
            domain: vec![4],
            reduce_axes: vec![],
            inputs: vec![input(DType::BF16, 4)],
            body: vec![
                Inst::Load { input: 0 },
                Inst::Unary {
                    op: UnaryOp::Exp,
                    x: 0,
                },
                Inst::Binary {
                    op: BinaryOp::Mul,
                    a: 1,
                    b: 1,
                },
                Inst::Const {
                    value: 1.0,
                    dtype: DType::BF16,
                },
                Inst::Binary {
                    op: BinaryOp::Add,
                    a: 2,
                    b: 3,
                },
            ],
            outputs: vec![Output { value: 1 }, Output { value: 4 }],
        }
    }

    #[test]
    fn a_bf16_value_its_kernel_stores_is_read_rounded_by_the_rest_of_the_kernel() {
        // e = exp(x), stored; y = e * e + 1, stored: y is computed from the e another kernel
        // loads, not from exp's unrounded f32 (random step 1074914's max and its gradient).
        let x = [0.3f32, -1.7, 0.01, 2.5];
        let w = bf16_arithmetic_in_f32(&exp_then_square());
        w.check().unwrap();
        let out = ingot_kernels::fused::cpu::run_buffers(&w, &[&bf16_bytes(&x)]).unwrap();
        let bf16s = |b: &[u8]| -> Vec<f32> {
            b.chunks(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                .collect()
        };
        let e: Vec<f32> = x
            .iter()
            .map(|&v| quantize_bf16(quantize_bf16(v).exp()))
            .collect();
        let y: Vec<f32> = e.iter().map(|&e| quantize_bf16(e * e + 1.0)).collect();
        assert_eq!(bf16s(&out[0]), e);
        assert_eq!(bf16s(&out[1]), y);
        // The case needs the unrounded e to give another y somewhere.
        let unrounded = x.iter().map(|&v| {
            let e = quantize_bf16(v).exp();
            quantize_bf16(e * e + 1.0)
        });
        assert!(unrounded.zip(&y).any(|(a, b)| a != *b));
    }

    #[test]
    fn a_bf16_value_whose_store_was_dropped_is_read_rounded_as_when_it_was_stored() {
        // The kernel above less its output `e` (fuse::unread: nothing else loads it), `e`
        // listed as unstored: `y` comes out as when `e` was stored (random steps 1498461 and
        // 1686696 moved when the dropped `e` was read unrounded).
        let stored = bf16_arithmetic_in_f32(&exp_then_square());
        let mut k = exp_then_square();
        k.outputs.remove(0);
        let dropped = bf16_arithmetic_in_f32_keeping(&k, &[1]);
        dropped.check().unwrap();
        let x = bf16_bytes(&[0.3f32, -1.7, 0.01, 2.5]);
        let run = |k: &FusedKernel| ingot_kernels::fused::cpu::run_buffers(k, &[&x]).unwrap();
        assert_eq!(run(&dropped)[0], run(&stored)[1]);
        // The case needs the unrounded `e` to give another `y`.
        assert_ne!(run(&bf16_arithmetic_in_f32(&k))[0], run(&stored)[1]);
    }

    #[test]
    fn a_bf16_value_leaving_bf16_is_the_value_stored_wherever_it_is_computed() {
        // The f32 that leaves the kernel is tanh's value rounded to bf16, not tanh's f32.
        let x = [0.3f32, -1.7, 0.01, 2.5];
        let stored: Vec<f32> = x
            .iter()
            .map(|&v| quantize_bf16(quantize_bf16(v).tanh()))
            .collect();
        let xb = bf16_bytes(&x);
        let w = bf16_arithmetic_in_f32(&tanh_leaving_bf16(Some(DType::F32)));
        let out = ingot_kernels::fused::cpu::run_buffers(&w, &[&xb]).unwrap();
        let got: Vec<f32> = out[0]
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, stored);
        assert_ne!(
            got[0],
            quantize_bf16(0.3).tanh(),
            "the case needs tanh's f32 to differ from its bf16"
        );
        // Compared with the stored values (reduce_max's gradient: `x == max`), every element
        // is equal, as the op-by-op step finds.
        let sb = bf16_bytes(&stored);
        let w = bf16_arithmetic_in_f32(&tanh_leaving_bf16(None));
        let out = ingot_kernels::fused::cpu::run_buffers(&w, &[&xb, &sb]).unwrap();
        assert_eq!(out[0], vec![1u8; 4]);
    }
}
