//! Element types and the per-instruction operations over lane buffers.

use super::consts::R;
use crate::cpu::scalar::{Float, Num};
use crate::cpu::Scalar;
use crate::dtype::{bf16_from_f64, quantize_bf16};
use crate::fused::check::KernelError;
use crate::{BinaryOp, CmpOp, DType, UnaryOp};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

// Element types.

/// Plain data that a lane buffer's bytes can be viewed as.
pub(super) trait Pod:
    Copy + FromBytes + IntoBytes + Immutable + KnownLayout + 'static
{
}
impl<T: Copy + FromBytes + IntoBytes + Immutable + KnownLayout + 'static> Pod for T {}

/// A value in a lane buffer: f32, f64, i32, i64, or u8 for bool.
pub(super) trait Elem: Pod + PartialOrd {
    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64;
    fn to_i32(self) -> i32;
    fn to_i64(self) -> i64;
    /// Nonzero (NaN included) is true.
    fn to_bool(self) -> u8;
    /// The nearest bf16, as the f32 a lane holds for it (see the module docs).
    fn to_bf16(self) -> f32;
    fn from_usize(v: usize) -> Self;
}

/// `to_f32`, `to_f64`, ...: each the element as `$norm` reads it (the number itself, or a
/// bool's 0 or 1), cast to the target type.
macro_rules! casts {
    ($norm:expr; $($name:ident: $to:ty),*) => {
        $(
            #[inline(always)]
            fn $name(self) -> $to {
                $norm(self) as $to
            }
        )*
    };
}

/// `Elem` for `$t`, whose zero is `$zero`, read as a number by `$norm`, rounded to bf16 by
/// `$to_bf16` and made from an index by `$from`: the numbers and u8 (bool) differ only there
/// (a number is read as itself and made by a cast).
macro_rules! elem {
    ($t:ty, $zero:expr, $to_bf16:expr) => {
        elem!($t, $zero, |x: $t| x, $to_bf16, |v| v as $t);
    };
    ($t:ty, $zero:expr, $norm:expr, $to_bf16:expr, $from:expr) => {
        #[allow(clippy::unnecessary_cast)]
        impl Elem for $t {
            casts!($norm; to_f32: f32, to_f64: f64, to_i32: i32, to_i64: i64);
            #[inline(always)]
            fn to_bool(self) -> u8 {
                (self != $zero) as u8
            }
            #[inline(always)]
            fn to_bf16(self) -> f32 {
                $to_bf16(self)
            }
            #[inline(always)]
            fn from_usize(v: usize) -> Self {
                $from(v)
            }
        }
    };
}
elem!(f32, 0.0, quantize_bf16);
elem!(f64, 0.0, |x: f64| bf16_from_f64(x).to_f32());
elem!(i32, 0, |x: i32| bf16_from_f64(x as f64).to_f32());
// Through f64: exact below 2^53, beyond which this rounds twice.
elem!(i64, 0, |x: i64| bf16_from_f64(x as f64).to_f32());
// A bool: any nonzero byte is true, 1.
elem!(
    u8,
    0,
    |x: u8| (x != 0) as u8,
    |x: u8| (x != 0) as u8 as f32,
    |v| (v != 0) as u8
);

/// A numeric element of a lane buffer, with its arithmetic ([`Num`]).
pub(super) trait NumElem: Num + Elem {}
impl<T: Num + Elem> NumElem for T {}

/// A float element of a lane buffer, with its arithmetic ([`Float`]).
pub(super) trait FloatElem: Float + Elem {}
impl<T: Float + Elem> FloatElem for T {}

pub(super) fn typed<T: Pod>(b: &[u8]) -> R<&[T]> {
    <[T]>::ref_from_bytes(b).map_err(|_| KernelError::Internal("lane buffer misaligned"))
}

pub(super) fn typed_mut<T: Pod>(b: &mut [u8]) -> R<&mut [T]> {
    <[T]>::mut_from_bytes(b).map_err(|_| KernelError::Internal("lane buffer misaligned"))
}

pub(super) fn sub<T>(b: &[T], start: usize, len: usize) -> R<&[T]> {
    start
        .checked_add(len)
        .and_then(|end| b.get(start..end))
        .ok_or(KernelError::Internal("range outside a buffer"))
}

pub(super) fn sub_mut<T>(b: &mut [T], start: usize, len: usize) -> R<&mut [T]> {
    start
        .checked_add(len)
        .and_then(|end| b.get_mut(start..end))
        .ok_or(KernelError::Internal("range outside a buffer"))
}

#[inline(always)]
pub(super) fn map<A: Copy, O>(a: &[A], o: &mut [O], f: impl Fn(A) -> O) {
    for (o, &a) in o.iter_mut().zip(a) {
        *o = f(a);
    }
}

#[inline(always)]
pub(super) fn map2<A: Copy, B: Copy, O>(a: &[A], b: &[B], o: &mut [O], f: impl Fn(A, B) -> O) {
    for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
        *o = f(a, b);
    }
}

/// Calls `$f::<T>(args)` with `T` the Rust type of a dtype code's lanes, `$bool` for bool;
/// bf16 is an internal error (its lanes are f32).
macro_rules! by_type {
    ($dt:expr, $f:ident($($arg:expr),*), $bool:expr) => {
        match $dt {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::Bool => $bool,
            DType::BF16 => Err(KernelError::Internal("bf16 lanes are f32")),
        }
    };
}

/// `by_type` over the numeric types; bool is an internal error (the check rejects it).
macro_rules! by_num {
    ($dt:expr, $f:ident($($arg:expr),*)) => {
        by_type!($dt, $f($($arg),*), Err(KernelError::Internal("numeric op on bool")))
    };
}

/// `by_type` over every element type, bool as u8.
macro_rules! by_elem {
    ($dt:expr, $f:ident($($arg:expr),*)) => {
        by_type!($dt, $f($($arg),*), $f::<u8>($($arg),*))
    };
}

pub(super) fn unary<T: NumElem>(op: UnaryOp, a: &[u8], o: &mut [u8]) -> R {
    let (a, o) = (typed::<T>(a)?, typed_mut::<T>(o)?);
    match op {
        UnaryOp::Neg => map(a, o, T::neg),
        _ => return Err(KernelError::Internal("float op on an integer")),
    }
    Ok(())
}

pub(super) fn unary_float<T: FloatElem>(op: UnaryOp, a: &[u8], o: &mut [u8]) -> R {
    let (a, o) = (typed::<T>(a)?, typed_mut::<T>(o)?);
    match op {
        UnaryOp::Neg => map(a, o, T::neg),
        UnaryOp::Exp => map(a, o, T::exp),
        UnaryOp::Log => map(a, o, T::ln),
        UnaryOp::Sqrt => map(a, o, T::sqrt),
        UnaryOp::Tanh => map(a, o, T::tanh),
        UnaryOp::Recip => map(a, o, T::recip),
        UnaryOp::Erf => map(a, o, T::erf),
    }
    Ok(())
}

/// An operand of a binary op: a value per lane, or one value for every lane of the chunk.
#[derive(Clone, Copy)]
pub(super) enum Arg<'a> {
    Lanes(&'a [u8]),
    Uniform(&'a [u8]),
}

impl Arg<'_> {
    pub(super) fn scalar<T: Pod>(b: &[u8]) -> R<T> {
        typed::<T>(b)?
            .first()
            .copied()
            .ok_or(KernelError::Internal("empty operand"))
    }
}

#[inline(always)]
pub(super) fn apply2<T: Pod>(a: Arg<'_>, b: Arg<'_>, o: &mut [u8], f: impl Fn(T, T) -> T) -> R {
    let o = typed_mut::<T>(o)?;
    match (a, b) {
        (Arg::Lanes(a), Arg::Lanes(b)) => map2(typed::<T>(a)?, typed::<T>(b)?, o, f),
        (Arg::Lanes(a), Arg::Uniform(b)) => {
            let y = Arg::scalar::<T>(b)?;
            map(typed::<T>(a)?, o, |x| f(x, y));
        }
        (Arg::Uniform(a), Arg::Lanes(b)) => {
            let x = Arg::scalar::<T>(a)?;
            map(typed::<T>(b)?, o, |y| f(x, y));
        }
        (Arg::Uniform(a), Arg::Uniform(b)) => {
            o.fill(f(Arg::scalar::<T>(a)?, Arg::scalar::<T>(b)?));
        }
    }
    Ok(())
}

pub(super) fn binary<T: NumElem>(op: BinaryOp, a: Arg<'_>, b: Arg<'_>, o: &mut [u8]) -> R {
    match op {
        BinaryOp::Add => apply2(a, b, o, T::add),
        BinaryOp::Sub => apply2(a, b, o, T::sub),
        BinaryOp::Mul => apply2(a, b, o, T::mul),
        BinaryOp::Max => apply2(a, b, o, <T as Scalar>::max),
        BinaryOp::Min => apply2(a, b, o, T::min),
        BinaryOp::Div => Err(KernelError::Internal("div on an integer")),
    }
}

pub(super) fn binary_float<T: FloatElem>(op: BinaryOp, a: Arg<'_>, b: Arg<'_>, o: &mut [u8]) -> R {
    if op == BinaryOp::Div {
        return apply2(a, b, o, T::div);
    }
    binary::<T>(op, a, b, o)
}

pub(super) fn compare<T: Elem>(op: CmpOp, a: &[u8], b: &[u8], o: &mut [u8]) -> R {
    let (a, b) = (typed::<T>(a)?, typed::<T>(b)?);
    match op {
        CmpOp::Lt => map2(a, b, o, |x, y| (x < y) as u8),
        CmpOp::Le => map2(a, b, o, |x, y| (x <= y) as u8),
        CmpOp::Gt => map2(a, b, o, |x, y| (x > y) as u8),
        CmpOp::Ge => map2(a, b, o, |x, y| (x >= y) as u8),
        CmpOp::Eq => map2(a, b, o, |x, y| (x == y) as u8),
        CmpOp::Ne => map2(a, b, o, |x, y| (x != y) as u8),
    }
    Ok(())
}

/// `select` moves bit patterns, so it works on unsigned integers of the dtype's size.
pub(super) fn select<T: Pod>(c: &[u8], a: &[u8], b: &[u8], o: &mut [u8]) -> R {
    let (a, b, o) = (typed::<T>(a)?, typed::<T>(b)?, typed_mut::<T>(o)?);
    for (((o, &c), &a), &b) in o.iter_mut().zip(c).zip(a).zip(b) {
        *o = if c != 0 { a } else { b };
    }
    Ok(())
}

pub(super) fn convert<A: Elem>(to: DType, a: &[u8], o: &mut [u8]) -> R {
    let a = typed::<A>(a)?;
    match to {
        DType::F32 => map(a, typed_mut::<f32>(o)?, A::to_f32),
        DType::F64 => map(a, typed_mut::<f64>(o)?, A::to_f64),
        DType::I32 => map(a, typed_mut::<i32>(o)?, A::to_i32),
        DType::I64 => map(a, typed_mut::<i64>(o)?, A::to_i64),
        DType::Bool => map(a, o, A::to_bool),
        DType::BF16 => map(a, typed_mut::<f32>(o)?, A::to_bf16),
    }
    Ok(())
}

pub(super) fn fill_const(dt: DType, value: f64, o: &mut [u8]) -> R {
    match dt {
        DType::F32 => typed_mut::<f32>(o)?.fill(value.to_f32()),
        DType::F64 => typed_mut::<f64>(o)?.fill(value),
        DType::I32 => typed_mut::<i32>(o)?.fill(value.to_i32()),
        DType::I64 => typed_mut::<i64>(o)?.fill(value.to_i64()),
        DType::Bool => o.fill(value.to_bool()),
        DType::BF16 => typed_mut::<f32>(o)?.fill(bf16_from_f64(value).to_f32()),
    }
    Ok(())
}

/// Rounds f32 lanes to the nearest bf16 (see the module docs).
pub(super) fn quantize_lanes(o: &mut [u8]) -> R {
    for x in typed_mut::<f32>(o)? {
        *x = quantize_bf16(*x);
    }
    Ok(())
}

/// Widens `len` bf16 elements, loaded into the first `2 * len` bytes of `o`, to f32 lanes in
/// place: back to front, so that each element is read before its bytes are overwritten.
pub(super) fn widen_bf16(o: &mut [u8], len: usize) -> R {
    if o.len() < 4 * len {
        return Err(KernelError::Internal("lane buffer"));
    }
    for i in (0..len).rev() {
        let h = u16::from_ne_bytes([o[2 * i], o[2 * i + 1]]);
        let x = half::bf16::from_bits(h).to_f32();
        o[4 * i..4 * i + 4].copy_from_slice(&x.to_ne_bytes());
    }
    Ok(())
}

/// Fills `o` with copies of the element `e` (1, 2, 4 or 8 bytes).
pub(super) fn fill_bytes(e: &[u8], o: &mut [u8]) -> R {
    match *e {
        [b] => o.fill(b),
        [a, b] => typed_mut::<u16>(o)?.fill(u16::from_ne_bytes([a, b])),
        [a, b, c, d] => typed_mut::<u32>(o)?.fill(u32::from_ne_bytes([a, b, c, d])),
        [a, b, c, d, e, f, g, h] => {
            typed_mut::<u64>(o)?.fill(u64::from_ne_bytes([a, b, c, d, e, f, g, h]))
        }
        _ => return Err(KernelError::Internal("element size")),
    }
    Ok(())
}

/// Copies `seg` elements of `sz` bytes from `src`, starting at element `start`, `step` elements
/// apart, into `out`.
pub(super) fn gather(
    src: &[u8],
    sz: usize,
    start: usize,
    step: usize,
    seg: usize,
    out: &mut [u8],
) -> R {
    if seg == 0 {
        return Ok(());
    }
    let oob = || KernelError::Internal("load outside its input");
    let last = step
        .checked_mul(seg - 1)
        .and_then(|x| x.checked_add(start))
        .ok_or_else(oob)?;
    let end = last
        .checked_add(1)
        .and_then(|x| x.checked_mul(sz))
        .ok_or_else(oob)?;
    if end > src.len() || out.len() != seg * sz {
        return Err(oob());
    }
    match (step, sz) {
        (1, _) => out.copy_from_slice(&src[start * sz..end]),
        (0, _) => fill_bytes(&src[start * sz..end], out)?,
        (_, 1) => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = src[start + j * step];
            }
        }
        (_, 2) => {
            for (j, o) in out.chunks_exact_mut(2).enumerate() {
                let at = (start + j * step) * 2;
                o.copy_from_slice(&src[at..at + 2]);
            }
        }
        (_, 4) => gather_words::<u32>(src, start, step, out)?,
        (_, 8) => gather_words::<u64>(src, start, step, out)?,
        _ => return Err(KernelError::Internal("element size")),
    }
    Ok(())
}

/// `out`, words of `W`, from the words of `src` at `start, start + step, ...` (read unaligned).
fn gather_words<W: Pod>(src: &[u8], start: usize, step: usize, out: &mut [u8]) -> R {
    let n = std::mem::size_of::<W>();
    for (j, o) in typed_mut::<W>(out)?.iter_mut().enumerate() {
        let at = (start + j * step) * n;
        *o = W::read_from_bytes(&src[at..at + n])
            .map_err(|_| KernelError::Internal("element size"))?;
    }
    Ok(())
}
