//! Running a fused kernel on the host.
//!
//! [`run`] executes a [`FusedKernel`] over buffers that live in one byte arena (the step's memory
//! slab): each input and output is a byte offset into it, and so is a scratch region of
//! [`scratch_bytes`] bytes that the caller plans. A run allocates nothing on the heap (the
//! kernel's analysis, its per-instruction lane buffers and its loop indices all live in the
//! scratch region) and never panics: inconsistent arguments give a [`KernelError`].
//! [`run_buffers`] is the allocating convenience for tests and reference interpreters.
//!
//! # Strategy
//! Instructions are evaluated one at a time over a chunk of `L` lanes (`L` between 16 and 1024,
//! fewer for long bodies), each into its own lane buffer in the scratch, so that dispatch costs
//! once per chunk and the loops over lanes vectorize. Axes of size 1 are dropped (they change
//! no index); the remaining axes split three ways:
//! - **flat** (no reduce axis of size > 1): chunks are runs of `L` consecutive domain elements
//!   (row-major), every live instruction is evaluated per chunk and every output stored. A
//!   reduction over axes of size 1 is its operand (as [`crate::cpu::reduce()`] copies).
//! - **rows** (the innermost axis is reduced: softmax, layer norm): for each row (index of the
//!   kept axes) the kernel makes one pass over the row's reduced elements per reduction level,
//!   in chunks of `L` along the trailing reduced axes. Pass `p` evaluates the full instructions
//!   that reductions of level `p + 1` need (and, in the last pass, those the full outputs need,
//!   which are stored then). Row-level instructions are evaluated once per row, between the
//!   passes, and broadcast to the lanes that full instructions read. Full values a later pass
//!   needs are recomputed there, never stored.
//! - **columns** (the innermost axis is kept but some axis is reduced: a bias gradient summed
//!   over the batch): the same passes, but the lanes run across `L` consecutive indices of the
//!   trailing kept axes, so each pass walks the reduced indices with contiguous chunks and every
//!   lane accumulates its own reduction. Row-level values are lane vectors here.
//!
//! Values of constants only are computed once per run, on every lane. A binary op reads an
//! operand that is the same on every lane of the chunk (a constant; a row-level value in the
//! rows case) as one scalar. A full load whose chunk is contiguous and aligned in its input is
//! read in place; other loads copy their chunk into the lane buffer: a straight copy, a fill
//! where the access broadcasts, a gather otherwise (adjacent axes whose strides compose are
//! merged per input, so a transposed or sliced input splits chunks only where its layout does).
//! Results are identical whichever way a value is read.
//!
//! # Summation order
//! Reductions fold in exactly the order [`crate::cpu::reduce()`] uses for a tensor shaped like the
//! domain, so a fused reduction gives the unfused op's bits: in the rows case, each contiguous
//! run along the trailing reduced axes is folded, in blocks of [`RUN_BLOCK`] terms, into eight
//! interleaved partials combined as `((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7))`, and the block sums
//! of all the row's runs (a reduced axis before a kept one gives several), in row-major order,
//! go to a [`Cascade`] in the reduction's slot; in the columns case every lane's terms, in
//! row-major order, go to a cascade (its level 0 the lane buffer, the upper levels in scratch
//! that only kernels with more than [`FAN`] terms get). No accumulator takes more than
//! `RUN_BLOCK / 8` terms of a run or [`FAN`] other values one after another, so f32 sums stay
//! accurate at any length. Max does not cascade; it keeps the earlier of two equal values and
//! propagates NaN (`x > acc || x is NaN`).
//!
//! # bf16
//! A bf16 value lives in its lane buffer as the f32 it widens to, and every op computes on
//! those f32 lanes (reductions accumulate in f32): a load of a bf16 input widens it, an
//! instruction whose dtype is bf16 rounds its lanes to the nearest bf16 (ties to even) right
//! after it is evaluated (a reduction once, when it is finished), and a store narrows the
//! lanes (exactly, as they are rounded already). Each bf16 instruction therefore has the value
//! the unfused op computes and stores, so fusion changes no bit.
//!
//! # In place
//! Within a chunk every instruction is evaluated (every input element read, whether copied or
//! read in place) before any output is stored, and full outputs are stored in the last pass over
//! a row, after every read of that row. An output whose memory is an input that
//! [`FusedKernel::can_write_over`] allows is therefore read before it is overwritten, element by
//! element, whatever other outputs do.

use super::check::{checked_numel, code_dtype, operands};
use super::{FusedKernel, Inst, KernelError};
use crate::cpu::reduce::{keep_max, Cascade, FAN, LEVELS, RUN_BLOCK};
use crate::cpu::scalar::{Float, Num};
use crate::cpu::Scalar;
use crate::dtype::{bf16_from_f64, quantize_bf16};
use crate::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

type R<T = ()> = Result<T, KernelError>;

/// Alignment of every region carved from the scratch.
const ALIGN: usize = 64;
const MAX_LANES: usize = 1024;
const MIN_LANES: usize = 16;
/// Lanes × instructions to aim for.
const LANE_BUDGET: usize = 8192;
/// Bytes per lane in a lane buffer (the widest dtype).
const WORD: usize = 8;
/// Elements in a reduction's accumulator slot (rows case): eight partials, then the row's
/// cascade of block sums (its level 0 at [`RUNS`], which ends as the row's result; a max
/// folds its runs there).
const SLOT: usize = 16;
const RUNS: usize = 8;
const _: () = assert!(RUNS + LEVELS <= SLOT);

// Instruction flags.
const ROW: usize = 1;
/// Evaluated per chunk in the passes (full; in the flat case, every instruction).
const XFULL: usize = 2;
const LIVE: usize = 4;
/// A row-level value that full instructions read lane by lane (rows case).
const BCAST: usize = 8;
const OUT_FULL: usize = 16;
/// Computed from constants only: evaluated once per run, on every lane.
const CONST: usize = 32;
/// A full load that may be read in place (from the input's memory) instead of copied.
const DIRECT: usize = 64;
/// `src` entry of a value that is in its lane buffer.
const IN_BUFFER: usize = usize::MAX;
/// Padding between lane buffers, so that they do not all map to the same cache sets.
const SKEW: usize = 192;

// Axis flags.
const AX_RED: usize = 1;
const AX_T: usize = 2;

/// Bytes of scratch that [`run`] needs for `k`, alignment slack included. Depends only on the
/// numbers of instructions, reductions, axes and inputs; 0 if those overflow (then [`run`]
/// refuses the kernel).
pub fn scratch_bytes(k: &FusedKernel) -> usize {
    Layout::of(k).map_or(0, |l| l.total)
}

/// Lanes per chunk: up to 1024, fewer for long bodies, so that the lane buffers of f32 values
/// stay near 32 KiB (most of them are dead at any one time).
fn lane_count(n: usize) -> usize {
    ((LANE_BUDGET / n.max(1)) / 8 * 8).clamp(MIN_LANES, MAX_LANES)
}

/// Where things are in the scratch region.
struct Layout {
    /// Bound on the number of passes: reductions + 1.
    pb: usize,
    lanes: usize,
    meta_bytes: usize,
    buf_bytes: usize,
    part_bytes: usize,
    /// Upper cascade levels of the columns case's reductions, `LEVELS - 1` lane vectors each;
    /// only for kernels whose reductions take more than [`FAN`] terms (0 bytes otherwise).
    level_bytes: usize,
    total: usize,
}

impl Layout {
    fn of(k: &FusedKernel) -> Option<Layout> {
        let n = k.body.len();
        let rank = k.domain.len();
        let n_red = k
            .body
            .iter()
            .filter(|i| matches!(i, Inst::Reduce { .. }))
            .count();
        let pb = n_red + 1;
        let lanes = lane_count(n);
        // In the order `Meta::carve` takes them.
        let words = [
            n.checked_mul(5)?,              // dt, flags, depth, mark, src
            pb.checked_add(1)?,             // eval_start
            pb.checked_mul(n)?,             // eval
            pb.checked_add(1)?,             // acc_start
            n,                              // acc
            pb.checked_add(2)?,             // stage_start
            n,                              // stage
            rank.checked_mul(5)?,           // idx, axis, t, o, k axes
            k.inputs.len().checked_mul(2)?, // blk, step
        ]
        .iter()
        .try_fold(0usize, |a, &w| a.checked_add(w))?;
        let meta_bytes = words
            .checked_mul(size_of::<usize>())?
            .checked_next_multiple_of(ALIGN)?;
        let buf_bytes = n.checked_mul(lanes * WORD + SKEW)?;
        let part_bytes = n.checked_mul(SLOT * WORD)?;
        let level_bytes = if long_columns(k) {
            n_red.checked_mul((LEVELS - 1) * lanes * WORD)?
        } else {
            0
        };
        let total = ALIGN
            .checked_add(meta_bytes)?
            .checked_add(buf_bytes)?
            .checked_add(part_bytes)?
            .checked_add(level_bytes)?;
        Some(Layout {
            pb,
            lanes,
            meta_bytes,
            buf_bytes,
            part_bytes,
            level_bytes,
            total,
        })
    }
}

/// Whether `k` takes the columns case (see [`analyze`]) with more than [`FAN`] terms per
/// reduction, so that its sums need cascade levels beyond their lane buffers.
fn long_columns(k: &FusedKernel) -> bool {
    let dims = &k.domain;
    let red = |d: usize| k.reduce_axes.contains(&d);
    let any_reduced = k
        .reduce_axes
        .iter()
        .any(|&a| dims.get(a).is_some_and(|&d| d != 1));
    let innermost_kept = (0..dims.len())
        .rev()
        .find(|&d| dims[d] != 1)
        .is_some_and(|d| !red(d));
    let terms = k.reduce_axes.iter().fold(1usize, |t, &a| {
        t.saturating_mul(dims.get(a).copied().unwrap_or(1))
    });
    any_reduced && innermost_kept && terms > FAN
}

/// The kernel's analysis, in the scratch region.
struct Meta<'a> {
    dt: &'a mut [usize],
    flags: &'a mut [usize],
    depth: &'a mut [usize],
    mark: &'a mut [usize],
    src: &'a mut [usize],
    eval_start: &'a mut [usize],
    eval: &'a mut [usize],
    acc_start: &'a mut [usize],
    acc: &'a mut [usize],
    stage_start: &'a mut [usize],
    stage: &'a mut [usize],
    idx: &'a mut [usize],
    axis: &'a mut [usize],
    t_axes: &'a mut [usize],
    o_axes: &'a mut [usize],
    k_axes: &'a mut [usize],
    blk: &'a mut [usize],
    step: &'a mut [usize],
}

fn take<'a, T>(s: &mut &'a mut [T], n: usize) -> R<&'a mut [T]> {
    if n > s.len() {
        return Err(KernelError::Internal("scratch layout"));
    }
    let (a, b) = std::mem::take(s).split_at_mut(n);
    *s = b;
    Ok(a)
}

impl<'a> Meta<'a> {
    fn carve(mut w: &'a mut [usize], k: &FusedKernel, pb: usize) -> R<Meta<'a>> {
        let (n, rank, ni) = (k.body.len(), k.domain.len(), k.inputs.len());
        let w = &mut w;
        Ok(Meta {
            dt: take(w, n)?,
            flags: take(w, n)?,
            depth: take(w, n)?,
            mark: take(w, n)?,
            src: take(w, n)?,
            eval_start: take(w, pb + 1)?,
            eval: take(w, pb * n)?,
            acc_start: take(w, pb + 1)?,
            acc: take(w, n)?,
            stage_start: take(w, pb + 2)?,
            stage: take(w, n)?,
            idx: take(w, rank)?,
            axis: take(w, rank)?,
            t_axes: take(w, rank)?,
            o_axes: take(w, rank)?,
            k_axes: take(w, rank)?,
            blk: take(w, ni)?,
            step: take(w, ni)?,
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    Flat,
    Rows,
    Columns,
}

/// What the analysis found besides the tables.
struct Info {
    case: Case,
    passes: usize,
    n_t: usize,
    nt: usize,
    no: usize,
    nk: usize,
}

/// Classifies axes and instructions and builds the per-pass instruction lists. `m.dt` must hold
/// the dtypes from a successful check.
fn analyze(k: &FusedKernel, m: &mut Meta<'_>, pb: usize) -> R<Info> {
    let n = k.body.len();
    let rank = k.domain.len();
    let dims = &k.domain;

    // Axes.
    m.axis.fill(0);
    for &a in &k.reduce_axes {
        m.axis[a] |= AX_RED;
    }
    let eff = |d: usize| dims[d] != 1;
    let red = |m: &Meta<'_>, d: usize| m.axis[d] & AX_RED != 0;
    let case = if !k.reduce_axes.iter().any(|&a| eff(a)) {
        Case::Flat
    } else {
        match (0..rank).rev().find(|&d| eff(d)) {
            Some(d) if red(m, d) => Case::Rows,
            _ => Case::Columns,
        }
    };
    let mut t_first = rank;
    for d in (0..rank).rev() {
        if !eff(d) {
            continue;
        }
        let inside = match case {
            Case::Flat => true,
            Case::Rows => red(m, d),
            Case::Columns => !red(m, d),
        };
        if !inside {
            break;
        }
        t_first = d;
    }
    let (mut nt, mut no, mut nk) = (0, 0, 0);
    let mut n_t = 1usize;
    for (d, &dim) in dims.iter().enumerate() {
        if dim == 1 {
            continue;
        }
        if d >= t_first {
            m.axis[d] |= AX_T;
            m.t_axes[nt] = d;
            nt += 1;
            n_t = n_t.saturating_mul(dim);
        } else if red(m, d) {
            m.o_axes[no] = d;
            no += 1;
        } else {
            m.k_axes[nk] = d;
            nk += 1;
        }
    }
    // Per input: how many consecutive chunk positions one stride covers.
    for (i, inp) in k.inputs.iter().enumerate() {
        let s = &inp.access.strides;
        if nt == 0 {
            m.blk[i] = 1;
            m.step[i] = 0;
            continue;
        }
        let last = m.t_axes[nt - 1];
        let mut blk = dims[last].max(1);
        for q in (0..nt - 1).rev() {
            let (a, b) = (m.t_axes[q], m.t_axes[q + 1]);
            if s[b].checked_mul(dims[b]) == Some(s[a]) {
                blk = blk.saturating_mul(dims[a]);
            } else {
                break;
            }
        }
        m.blk[i] = blk;
        m.step[i] = s[last];
    }

    // Instructions: level, liveness, depth.
    for i in 0..n {
        let flags = &*m.flags;
        let row = k.row_level_with(&k.body[i], |j| flags[j] & ROW != 0);
        let xfull = case == Case::Flat || !row;
        let (ops, c) = operands(&k.body[i]);
        let constant = match k.body[i] {
            Inst::Const { .. } => true,
            Inst::Load { .. } | Inst::Index { .. } | Inst::Reduce { .. } => false,
            _ => ops[..c].iter().all(|&o| flags[o] & CONST != 0),
        };
        m.flags[i] = if row { ROW } else { 0 }
            | if xfull { XFULL } else { 0 }
            | if constant { CONST } else { 0 };
    }
    for out in &k.outputs {
        let v = out.value;
        m.flags[v] |= LIVE;
        if m.flags[v] & XFULL != 0 {
            m.flags[v] |= OUT_FULL;
        }
    }
    for i in (0..n).rev() {
        if m.flags[i] & LIVE != 0 {
            let (ops, c) = operands(&k.body[i]);
            for &o in &ops[..c] {
                m.flags[o] |= LIVE;
            }
        }
    }
    for i in 0..n {
        let (ops, c) = operands(&k.body[i]);
        let d = ops[..c].iter().map(|&o| m.depth[o]).max().unwrap_or(0);
        m.depth[i] = match k.body[i] {
            Inst::Reduce { .. } if case != Case::Flat => d + 1,
            _ => d,
        };
    }
    let mut passes = 0;
    if case == Case::Flat {
        passes = usize::from(!k.outputs.is_empty());
    } else {
        for i in 0..n {
            let f = m.flags[i];
            if f & LIVE == 0 {
                continue;
            }
            if matches!(k.body[i], Inst::Reduce { .. }) {
                passes = passes.max(m.depth[i]);
            }
            if f & OUT_FULL != 0 {
                passes = passes.max(m.depth[i] + 1);
            }
        }
    }
    if passes > pb {
        return Err(KernelError::Internal("more passes than planned"));
    }
    for i in 0..n {
        let f = m.flags[i];
        if matches!(k.body[i], Inst::Load { .. }) && f & (XFULL | OUT_FULL) == XFULL {
            m.flags[i] |= DIRECT;
        }
    }
    m.src.fill(IN_BUFFER);

    // Pass p evaluates the full instructions that the reductions of level p + 1 (and, in the
    // last pass, the full outputs) need, in body order.
    m.mark.fill(0);
    let mut c = 0;
    m.eval_start[0] = 0;
    for p in 0..passes {
        let begin = c;
        for i in (0..n).rev() {
            let f = m.flags[i];
            if f & LIVE == 0 {
                continue;
            }
            if let Inst::Reduce { x, .. } = k.body[i] {
                if case != Case::Flat && m.depth[i] == p + 1 && m.flags[x] & XFULL != 0 {
                    m.mark[x] = p + 1;
                }
            }
            let need =
                case == Case::Flat || m.mark[i] == p + 1 || (p + 1 == passes && f & OUT_FULL != 0);
            if need && f & XFULL != 0 && f & CONST == 0 {
                m.eval[c] = i;
                c += 1;
                let (ops, nops) = operands(&k.body[i]);
                for &o in &ops[..nops] {
                    if m.flags[o] & XFULL != 0 {
                        m.mark[o] = p + 1;
                    }
                }
            }
        }
        m.eval[begin..c].reverse();
        m.eval_start[p + 1] = c;
    }
    // The reductions that accumulate in pass p.
    c = 0;
    m.acc_start[0] = 0;
    for p in 0..passes {
        if case != Case::Flat {
            for i in 0..n {
                if m.flags[i] & LIVE != 0
                    && matches!(k.body[i], Inst::Reduce { .. })
                    && m.depth[i] == p + 1
                {
                    m.acc[c] = i;
                    c += 1;
                }
            }
        }
        m.acc_start[p + 1] = c;
    }
    // Row-level instructions of depth s are evaluated before pass s (after the last, for s =
    // passes); a reduction of depth s is finished there.
    c = 0;
    m.stage_start[0] = 0;
    let mut row_live = 0;
    for i in 0..n {
        if m.flags[i] & (LIVE | XFULL | CONST) == LIVE {
            row_live += 1;
        }
    }
    for s in 0..=passes {
        for i in 0..n {
            if m.flags[i] & (LIVE | XFULL | CONST) == LIVE && m.depth[i] == s {
                m.stage[c] = i;
                c += 1;
            }
        }
        m.stage_start[s + 1] = c;
    }
    if c != row_live {
        return Err(KernelError::Internal(
            "a row-level value outside every stage",
        ));
    }
    if case == Case::Rows {
        for i in 0..n {
            let f = m.flags[i];
            if f & LIVE == 0 {
                continue;
            }
            let (ops, nops) = operands(&k.body[i]);
            // Binary ops read a row-level operand as one value (see `Plan::uniform`).
            let reads_lanes = match k.body[i] {
                Inst::Reduce { .. } => true,
                Inst::Binary { .. } => false,
                _ => f & XFULL != 0,
            };
            if reads_lanes {
                for &o in &ops[..nops] {
                    if m.flags[o] & XFULL == 0 {
                        m.flags[o] |= BCAST;
                    }
                }
            }
        }
    }
    Ok(Info {
        case,
        passes,
        n_t,
        nt,
        no,
        nk,
    })
}

// ---------------------------------------------------------------------------------------------
// Element types.

/// Plain data that a lane buffer's bytes can be viewed as.
trait Pod: Copy + FromBytes + IntoBytes + Immutable + KnownLayout + 'static {}
impl<T: Copy + FromBytes + IntoBytes + Immutable + KnownLayout + 'static> Pod for T {}

/// A value in a lane buffer: f32, f64, i32, i64, or u8 for bool.
trait Elem: Pod + PartialOrd {
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

macro_rules! num_elem {
    ($t:ty, $zero:expr, $to_bf16:expr) => {
        #[allow(clippy::unnecessary_cast)]
        impl Elem for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn to_i32(self) -> i32 {
                self as i32
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
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
                v as $t
            }
        }
    };
}
num_elem!(f32, 0.0, quantize_bf16);
num_elem!(f64, 0.0, |x: f64| bf16_from_f64(x).to_f32());
num_elem!(i32, 0, |x: i32| bf16_from_f64(x as f64).to_f32());
// Through f64: exact below 2^53, beyond which this rounds twice.
num_elem!(i64, 0, |x: i64| bf16_from_f64(x as f64).to_f32());

impl Elem for u8 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        (self != 0) as u8 as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        (self != 0) as u8 as f64
    }
    #[inline(always)]
    fn to_i32(self) -> i32 {
        (self != 0) as i32
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        (self != 0) as i64
    }
    #[inline(always)]
    fn to_bool(self) -> u8 {
        (self != 0) as u8
    }
    #[inline(always)]
    fn to_bf16(self) -> f32 {
        (self != 0) as u8 as f32
    }
    #[inline(always)]
    fn from_usize(v: usize) -> Self {
        (v != 0) as u8
    }
}

/// A numeric element of a lane buffer, with its arithmetic ([`Num`]).
trait NumElem: Num + Elem {}
impl<T: Num + Elem> NumElem for T {}

/// A float element of a lane buffer, with its arithmetic ([`Float`]).
trait FloatElem: Float + Elem {}
impl<T: Float + Elem> FloatElem for T {}

fn typed<T: Pod>(b: &[u8]) -> R<&[T]> {
    <[T]>::ref_from_bytes(b).map_err(|_| KernelError::Internal("lane buffer misaligned"))
}

fn typed_mut<T: Pod>(b: &mut [u8]) -> R<&mut [T]> {
    <[T]>::mut_from_bytes(b).map_err(|_| KernelError::Internal("lane buffer misaligned"))
}

fn sub<T>(b: &[T], start: usize, len: usize) -> R<&[T]> {
    start
        .checked_add(len)
        .and_then(|end| b.get(start..end))
        .ok_or(KernelError::Internal("range outside a buffer"))
}

fn sub_mut<T>(b: &mut [T], start: usize, len: usize) -> R<&mut [T]> {
    start
        .checked_add(len)
        .and_then(|end| b.get_mut(start..end))
        .ok_or(KernelError::Internal("range outside a buffer"))
}

#[inline(always)]
fn map<A: Copy, O>(a: &[A], o: &mut [O], f: impl Fn(A) -> O) {
    for (o, &a) in o.iter_mut().zip(a) {
        *o = f(a);
    }
}

#[inline(always)]
fn map2<A: Copy, B: Copy, O>(a: &[A], b: &[B], o: &mut [O], f: impl Fn(A, B) -> O) {
    for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
        *o = f(a, b);
    }
}

/// Calls `$f::<T>(args)` with `T` the numeric Rust type of a dtype code; bool is an internal
/// error (the check rejects it).
macro_rules! by_num {
    ($dt:expr, $f:ident($($arg:expr),*)) => {
        match $dt {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::Bool => Err(KernelError::Internal("numeric op on bool")),
            DType::BF16 => Err(KernelError::Internal("bf16 lanes are f32")),
        }
    };
}

macro_rules! by_elem {
    ($dt:expr, $f:ident($($arg:expr),*)) => {
        match $dt {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::Bool => $f::<u8>($($arg),*),
            DType::BF16 => Err(KernelError::Internal("bf16 lanes are f32")),
        }
    };
}

fn unary<T: NumElem>(op: UnaryOp, a: &[u8], o: &mut [u8]) -> R {
    let (a, o) = (typed::<T>(a)?, typed_mut::<T>(o)?);
    match op {
        UnaryOp::Neg => map(a, o, T::neg),
        _ => return Err(KernelError::Internal("float op on an integer")),
    }
    Ok(())
}

fn unary_float<T: FloatElem>(op: UnaryOp, a: &[u8], o: &mut [u8]) -> R {
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
enum Arg<'a> {
    Lanes(&'a [u8]),
    Uniform(&'a [u8]),
}

impl Arg<'_> {
    fn scalar<T: Pod>(b: &[u8]) -> R<T> {
        typed::<T>(b)?
            .first()
            .copied()
            .ok_or(KernelError::Internal("empty operand"))
    }
}

#[inline(always)]
fn apply2<T: Pod>(a: Arg<'_>, b: Arg<'_>, o: &mut [u8], f: impl Fn(T, T) -> T) -> R {
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

fn binary<T: NumElem>(op: BinaryOp, a: Arg<'_>, b: Arg<'_>, o: &mut [u8]) -> R {
    match op {
        BinaryOp::Add => apply2(a, b, o, T::add),
        BinaryOp::Sub => apply2(a, b, o, T::sub),
        BinaryOp::Mul => apply2(a, b, o, T::mul),
        BinaryOp::Max => apply2(a, b, o, <T as Scalar>::max),
        BinaryOp::Min => apply2(a, b, o, T::min),
        BinaryOp::Div => Err(KernelError::Internal("div on an integer")),
    }
}

fn binary_float<T: FloatElem>(op: BinaryOp, a: Arg<'_>, b: Arg<'_>, o: &mut [u8]) -> R {
    if op == BinaryOp::Div {
        return apply2(a, b, o, T::div);
    }
    binary::<T>(op, a, b, o)
}

fn compare<T: Elem>(op: CmpOp, a: &[u8], b: &[u8], o: &mut [u8]) -> R {
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
fn select<T: Pod>(c: &[u8], a: &[u8], b: &[u8], o: &mut [u8]) -> R {
    let (a, b, o) = (typed::<T>(a)?, typed::<T>(b)?, typed_mut::<T>(o)?);
    for (((o, &c), &a), &b) in o.iter_mut().zip(c).zip(a).zip(b) {
        *o = if c != 0 { a } else { b };
    }
    Ok(())
}

fn convert<A: Elem>(to: DType, a: &[u8], o: &mut [u8]) -> R {
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

fn fill_const(dt: DType, value: f64, o: &mut [u8]) -> R {
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
fn quantize_lanes(o: &mut [u8]) -> R {
    for x in typed_mut::<f32>(o)? {
        *x = quantize_bf16(*x);
    }
    Ok(())
}

/// Widens `len` bf16 elements, loaded into the first `2 * len` bytes of `o`, to f32 lanes in
/// place: back to front, so that each element is read before its bytes are overwritten.
fn widen_bf16(o: &mut [u8], len: usize) -> R {
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
fn fill_bytes(e: &[u8], o: &mut [u8]) -> R {
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
fn gather(src: &[u8], sz: usize, start: usize, step: usize, seg: usize, out: &mut [u8]) -> R {
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
        (_, 4) => {
            let o = typed_mut::<u32>(out)?;
            for (j, o) in o.iter_mut().enumerate() {
                let at = (start + j * step) * 4;
                let mut b = [0u8; 4];
                b.copy_from_slice(&src[at..at + 4]);
                *o = u32::from_ne_bytes(b);
            }
        }
        (_, 8) => {
            let o = typed_mut::<u64>(out)?;
            for (j, o) in o.iter_mut().enumerate() {
                let at = (start + j * step) * 8;
                let mut b = [0u8; 8];
                b.copy_from_slice(&src[at..at + 8]);
                *o = u64::from_ne_bytes(b);
            }
        }
        _ => return Err(KernelError::Internal("element size")),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Execution.

/// The analysed kernel and where its buffers are.
struct Plan<'a> {
    k: &'a FusedKernel,
    dt: &'a [usize],
    flags: &'a [usize],
    eval_start: &'a [usize],
    eval: &'a [usize],
    acc_start: &'a [usize],
    acc: &'a [usize],
    stage_start: &'a [usize],
    stage: &'a [usize],
    axis: &'a [usize],
    t_axes: &'a [usize],
    o_axes: &'a [usize],
    k_axes: &'a [usize],
    blk: &'a [usize],
    step: &'a [usize],
    case: Case,
    passes: usize,
    n_t: usize,
    /// Rows case: runs per row; columns case: terms per output (both: the product of the
    /// reduced axes outside the chunk axes).
    n_o: usize,
    lanes: usize,
    /// Bytes between consecutive lane buffers.
    stride: usize,
    numel: usize,
    rows: usize,
    inputs: &'a [usize],
    outputs: &'a [usize],
    /// The scratch region's byte range in the arena.
    s0: usize,
    s1: usize,
}

/// What a run writes: the loop index, lane buffers, reduction slots, and the arena around the
/// scratch.
struct State<'a> {
    idx: &'a mut [usize],
    /// Per instruction: where its value for the current chunk is, if not in its lane buffer
    /// (the arena offset of a load read in place).
    src: &'a mut [usize],
    bufs: &'a mut [u8],
    parts: &'a mut [u8],
    /// Columns case: upper cascade levels, `(LEVELS - 1) * lanes` values per reduction in
    /// the order of the pass lists (empty when no reduction takes more than [`FAN`] terms).
    levels: &'a mut [u8],
    lo: &'a mut [u8],
    hi: &'a mut [u8],
}

fn list<'a>(start: &[usize], items: &'a [usize], p: usize) -> &'a [usize] {
    match (start.get(p), start.get(p + 1)) {
        (Some(&a), Some(&b)) => items.get(a..b).unwrap_or(&[]),
        _ => &[],
    }
}

/// The bytes `[a, a + bytes)` of the arena, outside the scratch region.
fn region<'m>(
    lo: &'m [u8],
    hi: &'m [u8],
    s0: usize,
    s1: usize,
    a: usize,
    bytes: usize,
) -> R<&'m [u8]> {
    if bytes == 0 {
        return Ok(&[]);
    }
    let b = a
        .checked_add(bytes)
        .ok_or(KernelError::Internal("buffer range"))?;
    if b <= s0 {
        sub(lo, a, bytes)
    } else if a >= s1 {
        sub(hi, a - s1, bytes)
    } else {
        Err(KernelError::Internal("buffer inside the scratch region"))
    }
}

fn region_mut<'m>(
    lo: &'m mut [u8],
    hi: &'m mut [u8],
    s0: usize,
    s1: usize,
    a: usize,
    bytes: usize,
) -> R<&'m mut [u8]> {
    if bytes == 0 {
        return Ok(&mut []);
    }
    let b = a
        .checked_add(bytes)
        .ok_or(KernelError::Internal("buffer range"))?;
    if b <= s0 {
        sub_mut(lo, a, bytes)
    } else if a >= s1 {
        sub_mut(hi, a - s1, bytes)
    } else {
        Err(KernelError::Internal("buffer inside the scratch region"))
    }
}

impl Plan<'_> {
    /// The dtype of instruction `i`'s lanes: its own, f32 for bf16 (see the module docs).
    fn dtype(&self, i: usize) -> DType {
        match code_dtype(self.dt[i]) {
            DType::BF16 => DType::F32,
            d => d,
        }
    }

    /// Whether instruction `i`'s value is bf16 (rounded after each op, narrowed on store).
    fn bf16(&self, i: usize) -> bool {
        code_dtype(self.dt[i]) == DType::BF16
    }

    /// Whether instruction `j` has one value over every chunk it is read in (then its lane 0
    /// holds it): a constant, or a row-level value while the lanes run along a row.
    fn uniform(&self, j: usize) -> bool {
        let f = self.flags[j];
        f & CONST != 0 || (self.case == Case::Rows && f & XFULL == 0)
    }

    /// Sets the chunk axes of `idx` to chunk position `p0`.
    fn set_t(&self, idx: &mut [usize], mut p: usize) {
        for &a in self.t_axes.iter().rev() {
            let d = self.k.domain[a].max(1);
            idx[a] = p % d;
            p /= d;
        }
    }

    /// Row-major position of `idx` in the domain.
    fn ravel(&self, idx: &[usize]) -> usize {
        idx.iter()
            .zip(&self.k.domain)
            .fold(0usize, |acc, (&i, &d)| acc.wrapping_mul(d).wrapping_add(i))
    }

    /// Row-major position of `idx` among the rows (reduce axes taken as size 1).
    fn ravel_row(&self, idx: &[usize]) -> usize {
        let mut acc = 0usize;
        for (d, (&i, &n)) in idx.iter().zip(&self.k.domain).enumerate() {
            if self.axis[d] & AX_RED == 0 {
                acc = acc.wrapping_mul(n).wrapping_add(i);
            }
        }
        acc
    }

    /// Input `n`'s element index at the chunk's outer index (`idx` off the chunk axes).
    fn outer_offset(&self, n: usize, idx: &[usize]) -> usize {
        let inp = &self.k.inputs[n];
        let mut base = inp.access.offset;
        for (d, (&s, &i)) in inp.access.strides.iter().zip(idx.iter()).enumerate() {
            if self.axis[d] & AX_T == 0 {
                base = base.wrapping_add(s.wrapping_mul(i));
            }
        }
        base
    }

    /// What chunk position `p` adds to input `n`'s element index.
    fn chunk_offset(&self, n: usize, mut p: usize) -> usize {
        let strides = &self.k.inputs[n].access.strides;
        let mut off = 0usize;
        for &a in self.t_axes.iter().rev() {
            let d = self.k.domain[a].max(1);
            off = off.wrapping_add(strides[a].wrapping_mul(p % d));
            p /= d;
        }
        off
    }

    /// Loads `len` elements of input `n` at chunk position `p0` into `out`.
    #[allow(clippy::too_many_arguments)]
    fn load(
        &self,
        idx: &[usize],
        lo: &[u8],
        hi: &[u8],
        n: usize,
        len: usize,
        p0: usize,
        out: &mut [u8],
    ) -> R {
        let inp = &self.k.inputs[n];
        let sz = inp.dtype.size();
        let src = region(lo, hi, self.s0, self.s1, self.inputs[n], inp.len * sz)?;
        let base = self.outer_offset(n, idx);
        let (blk, step) = (self.blk[n].max(1), self.step[n]);
        let (mut p, mut done) = (p0, 0);
        while done < len {
            // A segment: the positions up to the end of a block that one stride covers.
            let seg = (len - done).min(blk - p % blk);
            let start = base.wrapping_add(self.chunk_offset(n, p));
            gather(
                src,
                sz,
                start,
                step,
                seg,
                sub_mut(out, done * sz, seg * sz)?,
            )?;
            p += seg;
            done += seg;
        }
        Ok(())
    }

    /// The arena offset of input `n`'s `len` elements at chunk position `p0`, if they are
    /// contiguous and aligned, so that the load can be read in place.
    #[allow(clippy::too_many_arguments)]
    fn direct(
        &self,
        idx: &[usize],
        lo: &[u8],
        hi: &[u8],
        n: usize,
        len: usize,
        p0: usize,
    ) -> R<Option<usize>> {
        let inp = &self.k.inputs[n];
        let sz = inp.dtype.size();
        let (blk, step) = (self.blk[n].max(1), self.step[n]);
        if len == 0 || (step != 1 && len > 1) || p0 % blk + len > blk {
            return Ok(None);
        }
        let start = self
            .outer_offset(n, idx)
            .wrapping_add(self.chunk_offset(n, p0));
        let src = region(lo, hi, self.s0, self.s1, self.inputs[n], inp.len * sz)?;
        let Some(bytes) = start
            .checked_mul(sz)
            .and_then(|b| sub(src, b, len * sz).ok())
        else {
            return Err(KernelError::Internal("load outside its input"));
        };
        if !(bytes.as_ptr() as usize).is_multiple_of(sz) {
            return Ok(None);
        }
        Ok(Some(self.inputs[n] + start * sz))
    }

    /// The bytes of instruction `j`'s value on `len` lanes: its lane buffer (in `bufs`, which
    /// starts at buffer 0), or the input memory a load is read from in place.
    #[allow(clippy::too_many_arguments)]
    fn value<'b>(
        &self,
        src: &[usize],
        bufs: &'b [u8],
        lo: &'b [u8],
        hi: &'b [u8],
        j: usize,
        len: usize,
    ) -> R<&'b [u8]> {
        let bytes = len * self.dtype(j).size();
        match src[j] {
            IN_BUFFER => sub(bufs, j * self.stride, bytes),
            at => region(lo, hi, self.s0, self.s1, at, bytes),
        }
    }

    /// The index along `axis` at `len` chunk positions from `p0`.
    fn index<T: Elem>(&self, idx: &[usize], axis: usize, len: usize, p0: usize, o: &mut [u8]) -> R {
        let o = typed_mut::<T>(o)?;
        if self.axis[axis] & AX_T == 0 {
            o.fill(T::from_usize(idx[axis]));
            return Ok(());
        }
        let mut inner = 1usize;
        for &a in self.t_axes.iter().rev() {
            if a == axis {
                break;
            }
            inner = inner.saturating_mul(self.k.domain[a]);
        }
        let d = self.k.domain[axis].max(1);
        let inner = inner.max(1);
        let (mut v, mut c) = ((p0 / inner) % d, p0 % inner);
        for o in o.iter_mut().take(len) {
            *o = T::from_usize(v);
            c += 1;
            if c == inner {
                c = 0;
                v += 1;
                if v == d {
                    v = 0;
                }
            }
        }
        Ok(())
    }

    /// Evaluates instruction `i` at `len` chunk positions from `p0` into its lane buffer.
    fn eval(&self, st: &mut State<'_>, i: usize, len: usize, p0: usize) -> R {
        let dt = self.dtype(i);
        let sz = dt.size();
        let at = i * self.stride;
        if at > st.bufs.len() {
            return Err(KernelError::Internal("lane buffer"));
        }
        let (before, rest) = st.bufs.split_at_mut(at);
        let before: &[u8] = before;
        let out = sub_mut(rest, 0, len * sz)?;
        let stride = self.stride;
        if let Inst::Load { input } = self.k.body[i] {
            if self.k.inputs[input].dtype == DType::BF16 {
                st.src[i] = IN_BUFFER;
                self.load(st.idx, st.lo, st.hi, input, len, p0, out)?;
                return widen_bf16(out, len);
            }
            if self.flags[i] & DIRECT != 0 {
                if let Some(at) = self.direct(st.idx, st.lo, st.hi, input, len, p0)? {
                    st.src[i] = at;
                    return Ok(());
                }
            }
            st.src[i] = IN_BUFFER;
            return self.load(st.idx, st.lo, st.hi, input, len, p0, out);
        }
        let (src, lo, hi) = (&*st.src, &*st.lo, &*st.hi);
        let arg = |j: usize| self.value(src, before, lo, hi, j, len);
        let rounds = self.bf16(i)
            && matches!(
                self.k.body[i],
                Inst::Index { .. } | Inst::Unary { .. } | Inst::Binary { .. }
            );
        match self.k.body[i] {
            Inst::Load { .. } => Err(KernelError::Internal("load")),
            // The constant's own dtype: a bf16 one fills its lanes with the rounded f32.
            Inst::Const { value, dtype } => fill_const(dtype, value, out),
            Inst::Index { axis, .. } => by_elem!(dt, index_into(self, st.idx, axis, len, p0, out)),
            Inst::Unary { op, x } => {
                let a = arg(x)?;
                match dt {
                    DType::F32 => unary_float::<f32>(op, a, out),
                    DType::F64 => unary_float::<f64>(op, a, out),
                    DType::I32 => unary::<i32>(op, a, out),
                    DType::I64 => unary::<i64>(op, a, out),
                    DType::Bool => Err(KernelError::Internal("unary op on bool")),
                    DType::BF16 => Err(KernelError::Internal("bf16 lanes are f32")),
                }
            }
            Inst::Binary { op, a, b } => {
                let operand = |j: usize| -> R<Arg<'_>> {
                    Ok(if self.uniform(j) {
                        Arg::Uniform(sub(before, j * stride, self.dtype(j).size())?)
                    } else {
                        Arg::Lanes(arg(j)?)
                    })
                };
                let (a, b) = (operand(a)?, operand(b)?);
                match dt {
                    DType::F32 => binary_float::<f32>(op, a, b, out),
                    DType::F64 => binary_float::<f64>(op, a, b, out),
                    DType::I32 => binary::<i32>(op, a, b, out),
                    DType::I64 => binary::<i64>(op, a, b, out),
                    DType::Bool => Err(KernelError::Internal("binary op on bool")),
                    DType::BF16 => Err(KernelError::Internal("bf16 lanes are f32")),
                }
            }
            Inst::Compare { op, a, b } => {
                let t = self.dtype(a);
                let (a, b) = (arg(a)?, arg(b)?);
                by_elem!(t, compare(op, a, b, out))
            }
            Inst::Select { cond, a, b } => {
                let (c, a, b) = (arg(cond)?, arg(a)?, arg(b)?);
                match sz {
                    1 => select::<u8>(c, a, b, out),
                    4 => select::<u32>(c, a, b, out),
                    _ => select::<u64>(c, a, b, out),
                }
            }
            Inst::Convert { x, to } => {
                let from = self.dtype(x);
                let a = arg(x)?;
                by_elem!(from, convert(to, a, out))
            }
            Inst::Reduce { x, .. } => {
                if self.case != Case::Flat {
                    return Err(KernelError::Internal("reduction evaluated in a pass"));
                }
                // Every reduce axis has size 1: the reduction is its operand.
                out.copy_from_slice(arg(x)?);
                Ok(())
            }
        }?;
        if rounds {
            quantize_lanes(out)?;
        }
        Ok(())
    }

    fn eval_pass(&self, st: &mut State<'_>, p: usize, len: usize, p0: usize) -> R {
        for &i in list(self.eval_start, self.eval, p) {
            self.eval(st, i, len, p0)?;
        }
        Ok(())
    }

    /// Row-level instructions of stage `s` at `len` positions; in the rows case, finishes the
    /// stage's reductions and broadcasts values to `w` lanes.
    fn stage(&self, st: &mut State<'_>, s: usize, len: usize, p0: usize, w: usize) -> R {
        for &i in list(self.stage_start, self.stage, s) {
            let sz = self.dtype(i).size();
            if let Inst::Reduce { .. } = self.k.body[i] {
                if self.case == Case::Rows {
                    let v = sub(st.parts, i * SLOT * WORD + 8 * sz, sz)?;
                    let b = sub_mut(st.bufs, i * self.stride, sz)?;
                    b.copy_from_slice(v);
                    if self.bf16(i) {
                        quantize_lanes(b)?;
                    }
                }
            } else {
                self.eval(st, i, len, p0)?;
            }
            if self.case == Case::Rows && self.flags[i] & BCAST != 0 && w > 1 {
                let b = sub_mut(st.bufs, i * self.stride, w * sz)?;
                let (first, rest) = b.split_at_mut(sz);
                fill_bytes(first, rest)?;
            }
        }
        Ok(())
    }

    /// Reduction slots (rows case), see [`SlotStep`]; `run` is the run's index in its row.
    fn slots(&self, st: &mut State<'_>, p: usize, what: SlotStep, run: usize) -> R {
        let runs = Runs {
            multi: !self.o_axes.is_empty(),
            index: run,
            count: self.n_o,
            len: self.n_t,
        };
        for &r in list(self.acc_start, self.acc, p) {
            let Inst::Reduce { op, .. } = self.k.body[r] else {
                return Err(KernelError::Internal("not a reduction"));
            };
            let dt = self.dtype(r);
            let slot = sub_mut(st.parts, r * SLOT * WORD, SLOT * dt.size())?;
            by_num!(dt, slot_op(op, slot, what, runs))?;
        }
        Ok(())
    }

    /// Columns case: the upper cascade levels of the `c`-th reduction of the pass lists, on
    /// `len` lanes (empty when the kernel has none).
    fn levels<'m>(&self, levels: &'m mut [u8], c: usize, len: usize, sz: usize) -> R<&'m mut [u8]> {
        if levels.is_empty() {
            return Ok(&mut []);
        }
        let per = (LEVELS - 1) * self.lanes * WORD;
        sub_mut(levels, c * per, (LEVELS - 1) * len * sz)
    }

    /// The pass's reductions with their index in the pass lists.
    fn reductions(&self, p: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let first = self.acc_start.get(p).copied().unwrap_or(0);
        list(self.acc_start, self.acc, p)
            .iter()
            .enumerate()
            .map(move |(q, &r)| (first + q, r))
    }

    /// Accumulates the pass's reductions over the chunk's `len` lanes: at position `p0` of run
    /// `term` of the row (rows case), or as term `term` of every lane (columns case).
    fn accumulate(&self, st: &mut State<'_>, p: usize, len: usize, p0: usize, term: usize) -> R {
        for (c, r) in self.reductions(p) {
            let Inst::Reduce { op, x } = self.k.body[r] else {
                return Err(KernelError::Internal("not a reduction"));
            };
            let dt = self.dtype(r);
            let sz = dt.size();
            if self.case == Case::Rows {
                let xs = self.value(st.src, st.bufs, st.lo, st.hi, x, len)?;
                let slot = sub_mut(st.parts, r * SLOT * WORD, SLOT * sz)?;
                let first = term * self.n_t.div_ceil(RUN_BLOCK);
                by_num!(dt, acc_run(op, xs, slot, p0, first))?;
            } else {
                let at = r * self.stride;
                if at > st.bufs.len() {
                    return Err(KernelError::Internal("lane buffer"));
                }
                let (before, rest) = st.bufs.split_at_mut(at);
                let xs = self.value(st.src, before, st.lo, st.hi, x, len)?;
                let acc = sub_mut(rest, 0, len * sz)?;
                let upper = self.levels(st.levels, c, len, sz)?;
                by_num!(dt, acc_lanes(op, xs, acc, upper, term))?;
            }
        }
        Ok(())
    }

    /// Columns case: the pass's reductions start at the identity on `len` lanes.
    fn init_lanes(&self, st: &mut State<'_>, p: usize, len: usize) -> R {
        for (c, r) in self.reductions(p) {
            let Inst::Reduce { op, .. } = self.k.body[r] else {
                return Err(KernelError::Internal("not a reduction"));
            };
            let dt = self.dtype(r);
            let b = sub_mut(st.bufs, r * self.stride, len * dt.size())?;
            by_num!(dt, fill_identity(op, b))?;
            self.levels(st.levels, c, len, dt.size())?.fill(0);
        }
        Ok(())
    }

    /// Columns case: the pass's sums of `n_o` terms collect their cascade levels into their
    /// lane buffers.
    fn finish_lanes(&self, st: &mut State<'_>, p: usize, len: usize) -> R {
        if st.levels.is_empty() {
            return Ok(());
        }
        for (c, r) in self.reductions(p) {
            let Inst::Reduce { op, .. } = self.k.body[r] else {
                return Err(KernelError::Internal("not a reduction"));
            };
            if op != ReduceOp::Sum {
                continue;
            }
            let dt = self.dtype(r);
            let sz = dt.size();
            let acc = sub_mut(st.bufs, r * self.stride, len * sz)?;
            let upper = self.levels(st.levels, c, len, sz)?;
            by_num!(dt, finish_cascade_lanes(acc, upper, self.n_o))?;
        }
        Ok(())
    }

    /// Columns case: the pass's bf16 reductions, finished, round their lanes once.
    fn round_lanes(&self, st: &mut State<'_>, p: usize, len: usize) -> R {
        for (_, r) in self.reductions(p) {
            if self.bf16(r) {
                quantize_lanes(sub_mut(st.bufs, r * self.stride, len * 4)?)?;
            }
        }
        Ok(())
    }

    /// Stores `len` lanes of every output for which `full` matches, at element `elem`.
    fn store(&self, st: &mut State<'_>, full: bool, elem: usize, len: usize) -> R {
        for (j, out) in self.k.outputs.iter().enumerate() {
            let v = out.value;
            let is_full = self.flags[v] & XFULL != 0;
            if is_full != full {
                continue;
            }
            let sz = self.dtype(v).size();
            let n = if self.flags[v] & ROW != 0 {
                self.rows
            } else {
                self.numel
            };
            let src = sub(st.bufs, v * self.stride, len * sz)?;
            if self.bf16(v) {
                // The lanes are rounded already: narrowing is exact.
                let dst = region_mut(st.lo, st.hi, self.s0, self.s1, self.outputs[j], n * 2)?;
                let dst = sub_mut(dst, elem * 2, len * 2)?;
                for (d, x) in dst.chunks_exact_mut(2).zip(typed::<f32>(src)?) {
                    d.copy_from_slice(&half::bf16::from_f32(*x).to_bits().to_ne_bytes());
                }
                continue;
            }
            let dst = region_mut(st.lo, st.hi, self.s0, self.s1, self.outputs[j], n * sz)?;
            sub_mut(dst, elem * sz, len * sz)?.copy_from_slice(src);
        }
        Ok(())
    }

    fn run_flat(&self, st: &mut State<'_>) -> R {
        // The scratch holding `idx` is not cleared between runs: axes off the chunk (size 1)
        // must read 0, not what the last kernel left there.
        st.idx.fill(0);
        let mut p0 = 0;
        while p0 < self.n_t {
            let len = self.lanes.min(self.n_t - p0);
            self.eval_pass(st, 0, len, p0)?;
            self.store(st, true, p0, len)?;
            p0 += len;
        }
        Ok(())
    }

    fn run_rows(&self, st: &mut State<'_>) -> R {
        let dims = &self.k.domain;
        if self.k_axes.iter().any(|&a| dims[a] == 0) {
            return Ok(());
        }
        let o_empty = self.o_axes.iter().any(|&a| dims[a] == 0);
        let w = self.lanes.min(self.n_t);
        st.idx.fill(0);
        loop {
            self.stage(st, 0, 1, 0, w)?;
            for p in 0..self.passes {
                let last = p + 1 == self.passes;
                self.slots(st, p, SlotStep::StartRow, 0)?;
                if !o_empty {
                    for &a in self.o_axes {
                        st.idx[a] = 0;
                    }
                    let mut run = 0;
                    loop {
                        self.slots(st, p, SlotStep::StartRun, run)?;
                        let mut p0 = 0;
                        while p0 < self.n_t {
                            let len = self.lanes.min(self.n_t - p0);
                            self.set_t(st.idx, p0);
                            self.eval_pass(st, p, len, p0)?;
                            self.accumulate(st, p, len, p0, run)?;
                            if last {
                                let e = self.ravel(st.idx);
                                self.store(st, true, e, len)?;
                            }
                            p0 += len;
                        }
                        self.slots(st, p, SlotStep::EndRun, run)?;
                        run += 1;
                        if !next(st.idx, self.o_axes, dims) {
                            break;
                        }
                    }
                    self.slots(st, p, SlotStep::EndRow, run)?;
                }
                self.stage(st, p + 1, 1, 0, w)?;
            }
            let e = self.ravel_row(st.idx);
            self.store(st, false, e, 1)?;
            if !next(st.idx, self.k_axes, dims) {
                return Ok(());
            }
        }
    }

    fn run_columns(&self, st: &mut State<'_>) -> R {
        let dims = &self.k.domain;
        if self.k_axes.iter().any(|&a| dims[a] == 0) || self.n_t == 0 {
            return Ok(());
        }
        let o_empty = self.o_axes.iter().any(|&a| dims[a] == 0);
        st.idx.fill(0);
        loop {
            let mut p0 = 0;
            while p0 < self.n_t {
                let len = self.lanes.min(self.n_t - p0);
                self.set_t(st.idx, p0);
                self.stage(st, 0, len, p0, 0)?;
                for p in 0..self.passes {
                    let last = p + 1 == self.passes;
                    self.init_lanes(st, p, len)?;
                    if !o_empty {
                        for &a in self.o_axes {
                            st.idx[a] = 0;
                        }
                        let mut term = 0;
                        loop {
                            self.eval_pass(st, p, len, p0)?;
                            self.accumulate(st, p, len, p0, term)?;
                            term += 1;
                            if last {
                                let e = self.ravel(st.idx);
                                self.store(st, true, e, len)?;
                            }
                            if !next(st.idx, self.o_axes, dims) {
                                break;
                            }
                        }
                        self.finish_lanes(st, p, len)?;
                    }
                    self.round_lanes(st, p, len)?;
                    self.stage(st, p + 1, len, p0, 0)?;
                }
                let e = self.ravel_row(st.idx);
                self.store(st, false, e, len)?;
                p0 += len;
            }
            if !next(st.idx, self.k_axes, dims) {
                return Ok(());
            }
        }
    }
}

fn index_into<T: Elem>(
    pl: &Plan<'_>,
    idx: &[usize],
    axis: usize,
    len: usize,
    p0: usize,
    o: &mut [u8],
) -> R {
    pl.index::<T>(idx, axis, len, p0, o)
}

/// Advances the row-major odometer over `axes` of `idx`; false when it wraps around.
fn next(idx: &mut [usize], axes: &[usize], dims: &[usize]) -> bool {
    for &a in axes.iter().rev() {
        idx[a] += 1;
        if idx[a] < dims[a] {
            return true;
        }
        idx[a] = 0;
    }
    false
}

fn identity<T: NumElem>(op: ReduceOp) -> T {
    match op {
        ReduceOp::Sum => T::ZERO,
        ReduceOp::Max => T::LOWEST,
    }
}

fn fill_identity<T: NumElem>(op: ReduceOp, b: &mut [u8]) -> R {
    typed_mut::<T>(b)?.fill(identity(op));
    Ok(())
}

#[inline(always)]
fn fold8<T: Copy>(x: &[T], p: &mut [T; 8], f: impl Fn(T, T) -> T) {
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            p[j] = f(p[j], c[j]);
        }
    }
    for (j, &v) in chunks.remainder().iter().enumerate() {
        p[j] = f(p[j], v);
    }
}

/// The eight partials of a block combined, `((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7))`.
#[inline(always)]
fn combine8<T: Copy>(s: &[T], f: impl Fn(T, T) -> T) -> T {
    f(
        f(f(s[0], s[4]), f(s[2], s[6])),
        f(f(s[1], s[5]), f(s[3], s[7])),
    )
}

/// Rows case: folds a chunk, at position `p0` of its run (a multiple of 8), into the slot's
/// eight interleaved partials; a sum's partials restart at every multiple of [`RUN_BLOCK`],
/// after their block's sum goes to the row's cascade as value `first + p / RUN_BLOCK - 1`
/// (`first`: the run's first block's index in the row), as [`crate::cpu::reduce()`] does.
fn acc_run<T: NumElem>(op: ReduceOp, x: &[u8], slot: &mut [u8], p0: usize, first: usize) -> R {
    let x = typed::<T>(x)?;
    let slot = typed_mut::<T>(slot)?;
    if slot.len() < SLOT {
        return Err(KernelError::Internal("reduction slot"));
    }
    let mut p = [T::ZERO; 8];
    p.copy_from_slice(&slot[..8]);
    match op {
        ReduceOp::Sum => {
            let (mut pos, mut rest) = (p0, x);
            while !rest.is_empty() {
                if pos > 0 && pos.is_multiple_of(RUN_BLOCK) {
                    let b = combine8(&p, T::add);
                    Cascade::push(
                        &mut slot[RUNS..RUNS + LEVELS],
                        first + pos / RUN_BLOCK - 1,
                        b,
                    );
                    p = [T::ZERO; 8];
                }
                let take = rest.len().min(RUN_BLOCK - pos % RUN_BLOCK);
                fold8(&rest[..take], &mut p, T::add);
                pos += take;
                rest = &rest[take..];
            }
        }
        ReduceOp::Max => fold8(x, &mut p, keep_max),
    }
    slot[..8].copy_from_slice(&p);
    Ok(())
}

/// What [`slot_op`] does to a rows-case reduction slot.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SlotStep {
    /// A pass over a row starts: the row's cascade (or fold) is empty.
    StartRow,
    /// A run starts: partials at the identity.
    StartRun,
    /// A run ends: its last block goes to the row's cascade (a max's run into the row's fold).
    EndRun,
    /// The row's runs are all in: its result is collected at [`RUNS`].
    EndRow,
}

/// Where a run is among its row's (rows case).
#[derive(Clone, Copy)]
struct Runs {
    /// Whether a row has several runs (then a max folds them, else the run is the row's).
    multi: bool,
    /// The run's index in its row (for `EndRun`).
    index: usize,
    /// Runs per row.
    count: usize,
    /// Elements per run.
    len: usize,
}

fn slot_op<T: NumElem>(op: ReduceOp, slot: &mut [u8], what: SlotStep, runs: Runs) -> R {
    let s = typed_mut::<T>(slot)?;
    if s.len() < SLOT {
        return Err(KernelError::Internal("reduction slot"));
    }
    let id = identity::<T>(op);
    let blocks = runs.len.div_ceil(RUN_BLOCK);
    match (what, op) {
        (SlotStep::StartRow, _) => s[RUNS..RUNS + LEVELS].fill(id),
        (SlotStep::StartRun, _) => s[..8].fill(id),
        (SlotStep::EndRun, ReduceOp::Sum) if blocks == 0 => {}
        (SlotStep::EndRun, ReduceOp::Sum) => {
            let last = combine8(&s[..8], T::add);
            let k = (runs.index + 1) * blocks - 1;
            Cascade::push(&mut s[RUNS..RUNS + LEVELS], k, last);
        }
        (SlotStep::EndRun, ReduceOp::Max) => {
            let run = combine8(&s[..8], keep_max);
            s[RUNS] = if runs.multi {
                keep_max(s[RUNS], run)
            } else {
                run
            };
        }
        (SlotStep::EndRow, ReduceOp::Sum) => {
            let n = runs.count.saturating_mul(blocks);
            s[RUNS] = Cascade::finish(&s[RUNS..RUNS + LEVELS], n);
        }
        (SlotStep::EndRow, ReduceOp::Max) => {}
    }
    Ok(())
}

/// Columns case: every lane folds its own term, the `term`-th; a sum's lanes cascade (their
/// upper levels in `upper`, which may be empty when no lane takes more than [`FAN`] terms).
fn acc_lanes<T: NumElem>(
    op: ReduceOp,
    x: &[u8],
    acc: &mut [u8],
    upper: &mut [u8],
    term: usize,
) -> R {
    let x = typed::<T>(x)?;
    let acc = typed_mut::<T>(acc)?;
    match op {
        ReduceOp::Sum if term > 0 && term.is_multiple_of(FAN) => {
            let upper = typed_mut::<T>(upper)?;
            if upper.len() < (LEVELS - 1) * acc.len() {
                return Err(KernelError::Internal("cascade levels"));
            }
            Cascade::push_lanes(acc, upper, term, x);
        }
        ReduceOp::Sum => {
            for (a, &v) in acc.iter_mut().zip(x) {
                *a = a.add(v);
            }
        }
        ReduceOp::Max => {
            for (a, &v) in acc.iter_mut().zip(x) {
                *a = keep_max(*a, v);
            }
        }
    }
    Ok(())
}

/// Columns case: a sum's lanes after `n` terms, their cascade levels collected.
fn finish_cascade_lanes<T: NumElem>(acc: &mut [u8], upper: &mut [u8], n: usize) -> R {
    if n <= FAN {
        return Ok(());
    }
    let acc = typed_mut::<T>(acc)?;
    let upper = typed::<T>(upper)?;
    if upper.len() < (LEVELS - 1) * acc.len() {
        return Err(KernelError::Internal("cascade levels"));
    }
    Cascade::finish_lanes(acc, upper, n);
    Ok(())
}

/// Checks that `[offset, offset + bytes)` fits in `mem` and stays out of the scratch region.
fn check_range(
    what: &'static str,
    index: usize,
    offset: usize,
    bytes: usize,
    mem: usize,
    s0: usize,
    s1: usize,
) -> R {
    let end = offset.checked_add(bytes).filter(|&e| e <= mem);
    let Some(end) = end else {
        return Err(KernelError::BufferOutOfRange {
            what,
            index,
            offset,
            bytes,
            mem,
        });
    };
    if bytes > 0 && end > s0 && offset < s1 {
        return Err(KernelError::ScratchOverlap {
            what,
            index,
            offset,
            end,
            scratch_start: s0,
            scratch_end: s1,
        });
    }
    Ok(())
}

/// Runs `k` over buffers in the arena `mem`: input `n` is the `len × size` bytes at
/// `inputs[n]`, output `j` the [`FusedKernel::output_len`] elements at `outputs[j]`, and
/// `scratch` the start of [`scratch_bytes`]`(k)` bytes the run may use. Offsets need no
/// particular alignment. Outputs are written, inputs only read; an output may be the same
/// memory as an input where [`FusedKernel::can_write_over`] allows it (other overlaps give
/// unspecified values, but nothing worse).
///
/// Checks the kernel ([`FusedKernel::check`]) and that every buffer fits in `mem` outside the
/// scratch region before it writes anything but scratch. Allocates nothing on the heap unless it
/// returns an error.
pub fn run(
    k: &FusedKernel,
    mem: &mut [u8],
    inputs: &[usize],
    outputs: &[usize],
    scratch: usize,
) -> R {
    if inputs.len() != k.inputs.len() {
        return Err(KernelError::BufferCount {
            what: "inputs",
            expected: k.inputs.len(),
            given: inputs.len(),
        });
    }
    if outputs.len() != k.outputs.len() {
        return Err(KernelError::BufferCount {
            what: "outputs",
            expected: k.outputs.len(),
            given: outputs.len(),
        });
    }
    let lay = Layout::of(k).ok_or_else(|| KernelError::DomainTooLarge {
        domain: k.domain.clone(),
    })?;
    let mem_len = mem.len();
    let s0 = scratch;
    let s1 = match scratch.checked_add(lay.total) {
        Some(e) if e <= mem_len => e,
        _ => {
            return Err(KernelError::BufferOutOfRange {
                what: "scratch",
                index: 0,
                offset: scratch,
                bytes: lay.total,
                mem: mem_len,
            })
        }
    };
    for (n, (inp, &off)) in k.inputs.iter().zip(inputs).enumerate() {
        let bytes = inp.len.saturating_mul(inp.dtype.size());
        check_range("input", n, off, bytes, mem_len, s0, s1)?;
    }

    let (lo, rest) = mem.split_at_mut(s0);
    let (sc, hi) = rest.split_at_mut(lay.total);
    let pad = (ALIGN - sc.as_ptr() as usize % ALIGN) % ALIGN;
    let sc = sub_mut(sc, pad, lay.total - ALIGN)?;
    let (meta_b, rest) = sc.split_at_mut(lay.meta_bytes);
    let (bufs, rest) = rest.split_at_mut(lay.buf_bytes);
    let (parts, rest) = rest.split_at_mut(lay.part_bytes);
    let levels = sub_mut(rest, 0, lay.level_bytes)?;
    let words = <[usize]>::mut_from_bytes(meta_b)
        .map_err(|_| KernelError::Internal("scratch misaligned"))?;
    let mut m = Meta::carve(words, k, lay.pb)?;

    k.check_into(m.dt)?;
    let numel = checked_numel(&k.domain).ok_or_else(|| KernelError::DomainTooLarge {
        domain: k.domain.clone(),
    })?;
    let rows = k
        .domain
        .iter()
        .enumerate()
        .filter(|(d, _)| k.reduce_axes.binary_search(d).is_err())
        .try_fold(1usize, |n, (_, &d)| n.checked_mul(d))
        .ok_or_else(|| KernelError::DomainTooLarge {
            domain: k.domain.clone(),
        })?;
    let info = analyze(k, &mut m, lay.pb)?;
    for (j, (out, &off)) in k.outputs.iter().zip(outputs).enumerate() {
        let v = out.value;
        let n = if m.flags[v] & ROW != 0 { rows } else { numel };
        let bytes = n.saturating_mul(code_dtype(m.dt[v]).size());
        check_range("output", j, off, bytes, mem_len, s0, s1)?;
    }
    // With an empty domain only row-level outputs have elements.
    let row_outputs = k.outputs.iter().any(|o| m.flags[o.value] & ROW != 0);
    if k.outputs.is_empty() || (numel == 0 && !row_outputs) {
        return Ok(());
    }

    let Meta {
        dt,
        flags,
        src,
        eval_start,
        eval,
        acc_start,
        acc,
        stage_start,
        stage,
        idx,
        axis,
        t_axes,
        o_axes,
        k_axes,
        blk,
        step,
        ..
    } = m;
    let plan = Plan {
        k,
        dt,
        flags,
        eval_start,
        eval,
        acc_start,
        acc,
        stage_start,
        stage,
        axis,
        t_axes: &t_axes[..info.nt],
        o_axes: &o_axes[..info.no],
        k_axes: &k_axes[..info.nk],
        blk,
        step,
        case: info.case,
        passes: info.passes,
        n_t: info.n_t,
        n_o: o_axes[..info.no]
            .iter()
            .fold(1usize, |n, &a| n.saturating_mul(k.domain[a])),
        lanes: lay.lanes,
        stride: lay.lanes * WORD + SKEW,
        numel,
        rows,
        inputs,
        outputs,
        s0,
        s1,
    };
    let mut st = State {
        idx,
        src,
        bufs,
        parts,
        levels,
        lo,
        hi,
    };
    // Values of constants only are the same everywhere: computed once, on every lane.
    for i in 0..k.body.len() {
        if plan.flags[i] & (LIVE | CONST) == LIVE | CONST {
            plan.eval(&mut st, i, plan.lanes, 0)?;
        }
    }
    match plan.case {
        Case::Flat => plan.run_flat(&mut st),
        Case::Rows => plan.run_rows(&mut st),
        Case::Columns => plan.run_columns(&mut st),
    }
}

/// Runs `k` on separate buffers: `inputs[n]` holds input `n`'s bytes (native endianness,
/// exactly `len × size` of them; bool is one byte, 0 or 1). Returns each output's bytes,
/// [`FusedKernel::output_len`] elements of [`FusedKernel::output_dtype`]. Allocates an arena,
/// copies the inputs in and the outputs out; meant for tests and reference interpreters.
pub fn run_buffers(k: &FusedKernel, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>, KernelError> {
    k.check()?;
    if inputs.len() != k.inputs.len() {
        return Err(KernelError::BufferCount {
            what: "inputs",
            expected: k.inputs.len(),
            given: inputs.len(),
        });
    }
    let too_large = |what, index, bytes| KernelError::BufferOutOfRange {
        what,
        index,
        offset: 0,
        bytes,
        mem: usize::MAX,
    };
    // Buffers one after another, 256-aligned as the planner places them.
    let place = |at: usize, bytes: usize| -> Option<usize> {
        at.checked_add(bytes)?.checked_next_multiple_of(256)
    };
    let mut at = 0usize;
    let mut in_off = Vec::with_capacity(inputs.len());
    for (n, (inp, bytes)) in k.inputs.iter().zip(inputs).enumerate() {
        let want = inp.len.saturating_mul(inp.dtype.size());
        if bytes.len() != want {
            return Err(KernelError::BufferOutOfRange {
                what: "input",
                index: n,
                offset: 0,
                bytes: want,
                mem: bytes.len(),
            });
        }
        in_off.push(at);
        at = place(at, want).ok_or(too_large("input", n, want))?;
    }
    let mut out_off = Vec::with_capacity(k.outputs.len());
    let mut out_bytes = Vec::with_capacity(k.outputs.len());
    for j in 0..k.outputs.len() {
        let b = k.output_len(j).saturating_mul(k.output_dtype(j).size());
        out_off.push(at);
        out_bytes.push(b);
        at = place(at, b).ok_or(too_large("output", j, b))?;
    }
    let scratch = at;
    let sb = scratch_bytes(k);
    let total = at.checked_add(sb).ok_or(too_large("scratch", 0, sb))?;
    let mut mem = Vec::new();
    mem.try_reserve_exact(total)
        .map_err(|_| too_large("arena", 0, total))?;
    mem.resize(total, 0u8);
    for (&off, bytes) in in_off.iter().zip(inputs) {
        mem[off..off + bytes.len()].copy_from_slice(bytes);
    }
    run(k, &mut mem, &in_off, &out_off, scratch)?;
    Ok(out_off
        .iter()
        .zip(&out_bytes)
        .map(|(&o, &b)| mem[o..o + b].to_vec())
        .collect())
}
