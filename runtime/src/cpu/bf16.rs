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

use super::scratch::Scratch;
use crate::error::ExecError;
use half::bf16;
use ingot_compiler::ir::{BinaryOp, UnaryOp};
use ingot_kernels::cpu::{Float, Num, Scalar};

use ingot_compiler::lower::cpu::widened::{round_up, ALIGN};

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
pub(super) fn as_f32(region: &mut [u8], n: usize) -> &mut [f32] {
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
