//! The lane loops of a compiled program's instructions: each operation over a segment of lanes
//! ([`Val`]: a slice, or one value for every lane), compiled for the widest vectors the CPU has,
//! with the interpreter's scalar functions; and the lane counts a program's chunks are tried at.

use super::body::{bool_f32, Code, Src, Step};
use super::consts::R;
use crate::cpu::wide::{widest, Wide};
use crate::cpu::{Float, Num, Scalar};
use crate::fused::check::KernelError;
use crate::ops::{BinaryOp, CmpOp, UnaryOp};

/// Lane counts tried, largest first: the largest whose scratch fits is taken.
pub(super) const LANE_CHOICES: [usize; 7] = [1024, 512, 256, 128, 64, 32, 16];

/// An operand over one segment of lanes: a slice, or one value for every lane.
#[derive(Clone, Copy)]
pub(super) enum Val<'a> {
    Lanes(&'a [f32]),
    One(f32),
}

#[inline(always)]
fn map1(a: Val<'_>, o: &mut [f32], f: impl Fn(f32) -> f32) {
    match a {
        Val::Lanes(a) => {
            for (o, &x) in o.iter_mut().zip(a) {
                *o = f(x);
            }
        }
        Val::One(x) => o.fill(f(x)),
    }
}

#[inline(always)]
fn map2(a: Val<'_>, b: Val<'_>, o: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    match (a, b) {
        (Val::Lanes(a), Val::Lanes(b)) => {
            for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        }
        (Val::Lanes(a), Val::One(y)) => {
            for (o, &x) in o.iter_mut().zip(a) {
                *o = f(x, y);
            }
        }
        (Val::One(x), Val::Lanes(b)) => {
            for (o, &y) in o.iter_mut().zip(b) {
                *o = f(x, y);
            }
        }
        (Val::One(x), Val::One(y)) => o.fill(f(x, y)),
    }
}

/// Evaluates `st`, an operation (a load is an error here), into `o`, reading operand `s`
/// as `arg(s)`: the dispatch every stage and full step of both kinds of program makes.
#[inline(always)]
pub(super) fn apply_lanes<'a>(
    st: &Step,
    mut arg: impl FnMut(Src) -> R<Val<'a>>,
    o: &mut [f32],
) -> R {
    let a = st.args;
    match st.code {
        Code::Unary(op) => unary_lanes(op, arg(a[0])?, o),
        Code::Binary(op) => binary_lanes(op, arg(a[0])?, arg(a[1])?, o),
        Code::Compare(op) => compare_lanes(op, arg(a[0])?, arg(a[1])?, o),
        Code::Select => select_lanes(arg(a[0])?, arg(a[1])?, arg(a[2])?, o),
        Code::Load { .. } => return Err(KernelError::Internal("load")),
    }
    Ok(())
}

/// The lane loops of one instruction, compiled for the widest vectors this CPU has
/// ([`crate::cpu::wide`]; the same bits at every width).
enum Lanes<'a, 'o> {
    Unary(UnaryOp, Val<'a>, &'o mut [f32]),
    Binary(BinaryOp, Val<'a>, Val<'a>, &'o mut [f32]),
    Compare(CmpOp, Val<'a>, Val<'a>, &'o mut [f32]),
    Select(Val<'a>, Val<'a>, Val<'a>, &'o mut [f32]),
}

impl Wide for Lanes<'_, '_> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        match self {
            Lanes::Unary(op, a, o) => unary_loops(op, a, o),
            Lanes::Binary(op, a, b, o) => binary_loops(op, a, b, o),
            Lanes::Compare(op, a, b, o) => compare_loops(op, a, b, o),
            Lanes::Select(c, a, b, o) => select_loops(c, a, b, o),
        }
    }
}

pub(super) fn unary_lanes(op: UnaryOp, a: Val<'_>, o: &mut [f32]) {
    widest(Lanes::Unary(op, a, o))
}

pub(super) fn binary_lanes(op: BinaryOp, a: Val<'_>, b: Val<'_>, o: &mut [f32]) {
    widest(Lanes::Binary(op, a, b, o))
}

pub(super) fn compare_lanes(op: CmpOp, a: Val<'_>, b: Val<'_>, o: &mut [f32]) {
    widest(Lanes::Compare(op, a, b, o))
}

pub(super) fn select_lanes(c: Val<'_>, a: Val<'_>, b: Val<'_>, o: &mut [f32]) {
    widest(Lanes::Select(c, a, b, o))
}

#[inline(always)]
fn unary_loops(op: UnaryOp, a: Val<'_>, o: &mut [f32]) {
    match op {
        UnaryOp::Neg => map1(a, o, <f32 as Num>::neg),
        UnaryOp::Exp => map1(a, o, <f32 as Float>::exp),
        UnaryOp::Log => map1(a, o, <f32 as Float>::ln),
        UnaryOp::Sqrt => map1(a, o, <f32 as Float>::sqrt),
        UnaryOp::Tanh => map1(a, o, <f32 as Float>::tanh),
        UnaryOp::Recip => map1(a, o, <f32 as Float>::recip),
        UnaryOp::Erf => map1(a, o, <f32 as Float>::erf),
    }
}

#[inline(always)]
fn binary_loops(op: BinaryOp, a: Val<'_>, b: Val<'_>, o: &mut [f32]) {
    match op {
        BinaryOp::Add => map2(a, b, o, <f32 as Scalar>::add),
        BinaryOp::Sub => map2(a, b, o, <f32 as Num>::sub),
        BinaryOp::Mul => map2(a, b, o, <f32 as Num>::mul),
        BinaryOp::Div => map2(a, b, o, <f32 as Float>::div),
        BinaryOp::Max => map2(a, b, o, <f32 as Scalar>::max),
        BinaryOp::Min => map2(a, b, o, <f32 as Num>::min),
    }
}

#[inline(always)]
fn compare_loops(op: CmpOp, a: Val<'_>, b: Val<'_>, o: &mut [f32]) {
    match op {
        CmpOp::Lt => map2(a, b, o, |x, y| bool_f32(x < y)),
        CmpOp::Le => map2(a, b, o, |x, y| bool_f32(x <= y)),
        CmpOp::Gt => map2(a, b, o, |x, y| bool_f32(x > y)),
        CmpOp::Ge => map2(a, b, o, |x, y| bool_f32(x >= y)),
        CmpOp::Eq => map2(a, b, o, |x, y| bool_f32(x == y)),
        CmpOp::Ne => map2(a, b, o, |x, y| bool_f32(x != y)),
    }
}

/// `select` moves the operands' bits (as the interpreter's does), whatever they hold.
#[inline(always)]
fn select_loops(c: Val<'_>, a: Val<'_>, b: Val<'_>, o: &mut [f32]) {
    let pick = |c: f32, a: f32, b: f32| if c != 0.0 { a } else { b };
    match (c, a, b) {
        (Val::One(c), a, b) => map1(if c != 0.0 { a } else { b }, o, |x| x),
        (Val::Lanes(c), Val::Lanes(a), Val::Lanes(b)) => {
            for (((o, &c), &a), &b) in o.iter_mut().zip(c).zip(a).zip(b) {
                *o = pick(c, a, b);
            }
        }
        (Val::Lanes(c), a, b) => {
            for (j, (o, &c)) in o.iter_mut().zip(c).enumerate() {
                let at = |v: Val<'_>| match v {
                    Val::Lanes(s) => s.get(j).copied().unwrap_or(f32::NAN),
                    Val::One(x) => x,
                };
                *o = pick(c, at(a), at(b));
            }
        }
    }
}

/// Buffer `i` (of `w` values) among `before`, the written buffer's gap, and `after`.
pub(super) fn other<'b>(
    before: &'b [f32],
    after: &'b [f32],
    gap: usize,
    w: usize,
    i: usize,
) -> R<&'b [f32]> {
    let at = i
        .checked_mul(w)
        .ok_or(KernelError::Internal("buffer index"))?;
    let got = if at + w <= before.len() {
        before.get(at..at + w)
    } else if at >= gap {
        after.get(at - gap..at - gap + w)
    } else {
        None
    };
    got.ok_or(KernelError::Internal(
        "an operand in the buffer being written",
    ))
}
