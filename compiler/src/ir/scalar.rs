//! The scalar semantics of constants, as the runtime computes them (runtime/src/cpu/exec.rs:
//! f32 math in f32, wrapping integers, `as` conversions, NaN-propagating float max and min).
//! The rewriter folds constants with these, and attention recognition evaluates masks built
//! from constants with them, so a folded or evaluated value is the value a step would compute.

use crate::ir::{BinaryOp, CmpOp, DType, UnaryOp};

/// `v` as a constant of `dtype` stores it: what `full value=v` holds at run time, or `None`
/// when an f64 cannot hold it exactly (an i64 beyond 2^53).
pub fn canonical(v: f64, dtype: DType) -> Option<f64> {
    match dtype {
        DType::F32 => Some(v as f32 as f64),
        DType::F64 => Some(v),
        DType::I32 => Some((v as i32) as f64),
        DType::I64 => exact_i64(v as i64),
        DType::Bool => Some(if v != 0.0 { 1.0 } else { 0.0 }),
        DType::BF16 => Some(bf16(v)),
    }
}

/// `v` rounded to the nearest bf16 (ties to even), as a store of it does.
pub(crate) fn bf16(v: f64) -> f64 {
    ingot_kernels::dtype::bf16_from_f64(v).to_f64()
}

pub(crate) fn exact_i64(i: i64) -> Option<f64> {
    (i.unsigned_abs() <= 1 << 53).then_some(i as f64)
}

/// Elements of a shape, or `None` on overflow.
pub fn numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// A unary op on a constant of `dtype`, as the runtime computes it.
pub fn unary(u: UnaryOp, v: f64, dtype: DType) -> Option<f64> {
    match dtype {
        DType::F32 => {
            let x = v as f32;
            Some(match u {
                UnaryOp::Neg => -x,
                UnaryOp::Exp => ingot_kernels::cpu::Float::exp(x),
                UnaryOp::Log => x.ln(),
                UnaryOp::Sqrt => x.sqrt(),
                UnaryOp::Tanh => ingot_kernels::cpu::Float::tanh(x),
                UnaryOp::Recip => 1.0 / x,
                UnaryOp::Erf => ingot_kernels::cpu::Float::erf(x),
            } as f64)
        }
        DType::F64 => Some(match u {
            UnaryOp::Neg => -v,
            UnaryOp::Exp => v.exp(),
            UnaryOp::Log => v.ln(),
            UnaryOp::Sqrt => v.sqrt(),
            UnaryOp::Tanh => v.tanh(),
            UnaryOp::Recip => 1.0 / v,
            UnaryOp::Erf => ingot_kernels::cpu::Float::erf(v),
        }),
        DType::I32 => match u {
            UnaryOp::Neg => Some((v as i32).wrapping_neg() as f64),
            _ => None,
        },
        DType::I64 => match u {
            UnaryOp::Neg => exact_i64((v as i64).wrapping_neg()),
            _ => None,
        },
        DType::Bool => None,
        // Computed in f32, rounded on store.
        DType::BF16 => unary(u, v, DType::F32).map(bf16),
    }
}

/// A binary op on constants of `dtype`, as the runtime computes it.
pub fn binary(b: BinaryOp, x: f64, y: f64, dtype: DType) -> Option<f64> {
    macro_rules! float {
        ($t:ty) => {{
            let (x, y) = (x as $t, y as $t);
            Some(match b {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x * y,
                BinaryOp::Div => x / y,
                // NaN propagates, as in the kernels (`f64::max` would drop it).
                BinaryOp::Max | BinaryOp::Min if x.is_nan() || y.is_nan() => x + y,
                BinaryOp::Max => x.max(y),
                BinaryOp::Min => x.min(y),
            } as f64)
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let (x, y) = (x as $t, y as $t);
            match b {
                BinaryOp::Add => Some(x.wrapping_add(y)),
                BinaryOp::Sub => Some(x.wrapping_sub(y)),
                BinaryOp::Mul => Some(x.wrapping_mul(y)),
                BinaryOp::Max => Some(x.max(y)),
                BinaryOp::Min => Some(x.min(y)),
                BinaryOp::Div => None,
            }
        }};
    }
    match dtype {
        DType::F32 => float!(f32),
        DType::F64 => float!(f64),
        DType::I32 => int!(i32).map(|r| r as f64),
        DType::I64 => int!(i64).and_then(exact_i64),
        DType::Bool => None,
        // Computed in f32, rounded on store.
        DType::BF16 => float!(f32).map(bf16),
    }
}

/// A comparison of two constants of one dtype (exact in f64 for every dtype's constants).
pub fn compare(op: CmpOp, x: f64, y: f64) -> f64 {
    let r = match op {
        CmpOp::Lt => x < y,
        CmpOp::Le => x <= y,
        CmpOp::Gt => x > y,
        CmpOp::Ge => x >= y,
        CmpOp::Eq => x == y,
        CmpOp::Ne => x != y,
    };
    if r {
        1.0
    } else {
        0.0
    }
}

/// `convert` of a constant: Rust `as` casts; nonzero (NaN included) is `true`.
pub fn convert(v: f64, from: DType, to: DType) -> Option<f64> {
    match to {
        DType::F32 => Some(v as f32 as f64),
        DType::F64 => Some(v),
        DType::I32 if from.is_float() => Some((v as i32) as f64),
        // Integer to narrower integer truncates (wraps); bool is 0 or 1.
        DType::I32 => Some((v as i64 as i32) as f64),
        DType::I64 if from.is_float() => exact_i64(v as i64),
        DType::I64 => Some(v),
        DType::Bool => Some(if v != 0.0 { 1.0 } else { 0.0 }),
        DType::BF16 => Some(bf16(v)),
    }
}
