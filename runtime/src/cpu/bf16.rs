//! bf16 in the unfused executor: storage is bf16, arithmetic is f32, and every result is
//! rounded to the nearest bf16 (ties to even) when it is stored, as the GPU does and as the
//! fused CPU executor does (see `ingot_kernels::fused::cpu`), so that both give the same bits.
//!
//! Elementwise ops widen each operand element, compute in f32 and round: no scratch.
//! Reductions, matrix products and `scatter_add` are the f32 op on widened copies of their bf16
//! operands, with its f32 result rounded once at the end: a sum accumulates in f32 (in the
//! f32 kernel's order), a matmul multiplies bf16 values exactly and accumulates in f32, as
//! cuBLAS does with 32-bit compute. The widened copies and the f32 result live in the node's
//! scratch, whose size
//! [`ingot_compiler::lower::cpu::widened`] gives the planner (planned execution allocates nothing);
//! without planned scratch they are allocated per call.

use super::exec::{exec_node_with, Scratch};
use crate::error::ExecError;
use crate::tensor::{View, ViewMut};
use half::bf16;
use ingot_compiler::ir::{BinaryOp, DType, Node, TensorType, UnaryOp};
use ingot_kernels::cpu::{Float, Num, Scalar};
use smallvec::SmallVec;

use ingot_compiler::lower::cpu::widened::{regions, round_up, ALIGN};

/// `t` with its dtype f32 where it is bf16.
fn f32_type(t: &TensorType) -> TensorType {
    let dtype = if t.dtype == DType::BF16 {
        DType::F32
    } else {
        t.dtype
    };
    TensorType::new(t.shape.clone(), dtype)
}

/// Runs a reduction, matmul or scatter_add that involves bf16 as its f32 op over widened
/// operands, rounding the f32 result into `out`.
pub fn exec_widened(
    node: &Node,
    inputs: &[View<'_>],
    input_types: &[&TensorType],
    out: ViewMut<'_>,
    scratch: Scratch<'_>,
) -> Result<(), ExecError> {
    let op = node.op.name();
    let mut owned = Vec::new();
    let (mut rest, given) =
        widening_scratch(op, scratch, regions(&node.ty, input_types), &mut owned)?;
    // Inline storage: a planned step allocates nothing (matmul and scatter_add have 2 operands,
    // reductions 1; shapes up to rank 4 are inline too).
    let mut f32_inputs: SmallVec<[View<'_>; 3]> = SmallVec::new();
    for (v, t) in inputs.iter().zip(input_types) {
        match v {
            View::BF16(x) => f32_inputs.push(View::F32(widen_into(&mut rest, x))),
            other => {
                debug_assert_ne!(t.dtype, DType::BF16);
                f32_inputs.push(*other);
            }
        }
    }
    let n = node.ty.shape.numel();
    let (region, tail) = std::mem::take(&mut rest).split_at_mut(round_up(n * 4));
    let result = as_f32(region, n);
    let types: SmallVec<[TensorType; 3]> = input_types.iter().map(|t| f32_type(t)).collect();
    let type_refs: SmallVec<[&TensorType; 3]> = types.iter().collect();
    let f32_node = Node {
        op: node.op.clone(),
        inputs: node.inputs.clone(),
        ty: f32_type(&node.ty),
    };
    // Planned scratch holds the f32 kernel's own workspace after the regions.
    let inner = if given {
        Scratch::Given(tail)
    } else {
        Scratch::Allocate
    };
    exec_node_with(
        &f32_node,
        &f32_inputs,
        &type_refs,
        ViewMut::F32(result),
        inner,
    )?;
    match out {
        ViewMut::BF16(o) => {
            for (o, &x) in o.iter_mut().zip(result.iter()) {
                *o = bf16::from_f32(x);
            }
        }
        ViewMut::F32(o) => o.copy_from_slice(result),
        other => {
            return Err(ExecError::Invalid {
                op,
                reason: format!("a bf16 operand with a {} result", other.dtype()),
            })
        }
    }
    Ok(())
}

/// The bytes a widened op carves its f32 regions from ([`widen_into`]), from their first
/// aligned byte: the planned scratch, or `owned` made `need` bytes long when the interpreter
/// allocates; and whether the scratch was planned (the f32 kernel then gets what is left as
/// its own). A planned scratch shorter than `need` is an error.
pub(super) fn widening_scratch<'a>(
    op: &'static str,
    scratch: Scratch<'a>,
    need: usize,
    owned: &'a mut Vec<u64>,
) -> Result<(&'a mut [u8], bool), ExecError> {
    let given = matches!(scratch, Scratch::Given(_));
    let bytes: &mut [u8] = match scratch {
        Scratch::Given(b) => b,
        Scratch::Allocate => {
            *owned = vec![0; need.div_ceil(8)];
            // SAFETY: a u64 buffer viewed as its bytes (any bit pattern is a valid u8).
            unsafe {
                std::slice::from_raw_parts_mut(owned.as_mut_ptr() as *mut u8, owned.len() * 8)
            }
        }
    };
    if bytes.len() < need {
        return Err(ExecError::Invalid {
            op,
            reason: format!(
                "the workspace has {} bytes, bf16 widening needs {need}",
                bytes.len()
            ),
        });
    }
    let pad = (ALIGN - bytes.as_ptr() as usize % ALIGN) % ALIGN;
    Ok((&mut bytes[pad..], given))
}

/// Carves the next aligned region of `n` f32s from the front of `rest` (which moves past it)
/// and fills it with `x` widened: how a bf16 operand is read by the f32 kernel that computes
/// for it.
pub(super) fn widen_into<'a>(rest: &mut &'a mut [u8], x: &[bf16]) -> &'a mut [f32] {
    let (region, tail) = std::mem::take(rest).split_at_mut(round_up(x.len() * 4));
    *rest = tail;
    let w = as_f32(region, x.len());
    for (w, x) in w.iter_mut().zip(x) {
        *w = x.to_f32();
    }
    w
}

/// The first `n` f32s of an aligned byte region.
fn as_f32(region: &mut [u8], n: usize) -> &mut [f32] {
    assert!(region.len() >= n * 4 && (region.as_ptr() as usize).is_multiple_of(4));
    // SAFETY: the region is exclusively borrowed, long enough and aligned for f32 (checked);
    // every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(region.as_mut_ptr() as *mut f32, n) }
}

/// `u` on bf16 elements: f32 arithmetic, rounded on store.
pub fn unary(u: UnaryOp, a: &[bf16], o: &mut [bf16]) {
    let f: fn(f32) -> f32 = match u {
        UnaryOp::Neg => Num::neg,
        UnaryOp::Exp => Float::exp,
        UnaryOp::Log => Float::ln,
        UnaryOp::Sqrt => Float::sqrt,
        UnaryOp::Tanh => Float::tanh,
        UnaryOp::Recip => Float::recip,
        UnaryOp::Erf => Float::erf,
    };
    for (o, &a) in o.iter_mut().zip(a) {
        *o = bf16::from_f32(f(a.to_f32()));
    }
}

/// `b` on bf16 elements: f32 arithmetic (NaN-propagating max and min), rounded on store.
pub fn binary(b: BinaryOp, x: &[bf16], y: &[bf16], o: &mut [bf16]) {
    let f: fn(f32, f32) -> f32 = match b {
        BinaryOp::Add => Scalar::add,
        BinaryOp::Sub => Num::sub,
        BinaryOp::Mul => Num::mul,
        BinaryOp::Div => Float::div,
        BinaryOp::Max => Scalar::max,
        BinaryOp::Min => Num::min,
    };
    for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
        *o = bf16::from_f32(f(x.to_f32(), y.to_f32()));
    }
}
