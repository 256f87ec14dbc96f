//! Fused kernels translated once, when a step is loaded, into straight-line programs of whole-chunk
//! loops: the fast path beside the interpreter ([`super::run`]), which stays the reference.
//!
//! # Why not interpret
//! The interpreter decides everything per chunk: each instruction's dtype, where its operands
//! are, whether a load can be read in place, which reductions a pass feeds. That costs little
//! over long chunks, but the rows that dominate a transformer's step on the CPU are short (a
//! layer norm's rows of `d_model`, a loss's rows of `vocab`), and the interpreter walks them one
//! row at a time: on the README's main job (rows of 64) it spent a third of the step on its own
//! bookkeeping. A [`Compiled`] kernel has made every such decision when it was built (each
//! operand is a lane buffer, a per-row value or a constant; each loop a monomorphised Rust loop
//! over `f32` that the compiler vectorises), and it runs **several short rows in one chunk**,
//! so that each instruction's dispatch is paid once per chunk of up to [`MAX_LANES`] lanes,
//! not once per row.
//!
//! # Which kernels
//! Kernels whose values are all `f32` (bools, from compares or bool inputs, read only by
//! selects, as their condition, or stored as outputs: a ReLU's mask), with loads,
//! constants, unary, binary, compare and select instructions and sum or max reductions, in the
//! interpreter's flat case or its rows case (the innermost axis of size > 1 reduced), whose
//! every input walks the inner axes with a single stride, as the programs of `rows`: the
//! kept axes outside, the reduced ones inside, wherever the reduced axes outside the inner
//! ones lie among the kept ones (a batch norm's `[N, C, H, W]` reduced over `[0, 2, 3]`:
//! several runs a row); and column reductions whose reduced axes all come before their
//! kept ones, as the programs of `columns`. [`Compiled::new`] says `None` for the
//! rest, which the interpreter runs as before: indices, converts, other dtypes (bf16
//! included), other column reductions, empty domains, and kernels whose program would not fit
//! in the scratch the planner reserved for the interpreter ([`super::scratch_bytes`]), which
//! is all a compiled kernel uses.
//!
//! # Threads
//! A program's rows (a column reduction's columns) are computed each alone, so
//! [`Compiled::run_rows`] runs any range of them with the bits the whole run gives them, and
//! [`Compiled::row_ranges`] cuts them for threads: the way to run on several threads a kernel
//! that [`crate::fused::parts`] cannot cut into smaller kernels (a batch norm with a full
//! output, whose outermost axis is reduced).
//!
//! # The same bits
//! Every value is computed by the same scalar functions the interpreter calls
//! ([`crate::cpu::Float`], [`crate::cpu::Num`], [`crate::cpu::Scalar`]), and every reduction of a
//! row folds through the interpreter's own accumulation functions (`acc_run` and `slot_op`: the
//! eight interleaved partials, blocks of [`RUN_BLOCK`](crate::cpu::reduce::RUN_BLOCK) and the cascade), one row at a time,
//! whichever rows share a chunk. Elementwise IEEE arithmetic gives the same result vectorised
//! or not (at any vector width: each instruction's lane loops are compiled for the widest
//! vectors the CPU has, [`crate::cpu::wide`]), so a compiled kernel writes the interpreter's bits; the tests hold it to that on
//! random kernels, on their pieces for 1, 2 and 3 threads, and on whole training steps.
//!
//! # In place
//! As in the interpreter: within a chunk every load happens before any store, and full outputs
//! are stored in the last pass, so an output written over an input that
//! [`FusedKernel::can_write_over`] allows is read before it is overwritten.

use super::columns::Columns;
use super::rows::Program;
use super::{check_buffer_counts, check_range, KernelError, ALIGN, R};
use crate::cpu::wide::{widest, Wide};
use crate::cpu::{Float, Num, Scalar};
use crate::fused::{FusedKernel, Inst};
use crate::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use std::ops::Range;
use zerocopy::FromBytes;

/// The most lanes a chunk holds.
pub const MAX_LANES: usize = 1024;
/// Lane counts tried, largest first: the largest whose scratch fits is taken.
pub(super) const LANE_CHOICES: [usize; 7] = [1024, 512, 256, 128, 64, 32, 16];

/// Where an operand's value is, for the chunk being computed.
#[derive(Clone, Copy, Debug)]
pub(super) enum Src {
    /// Lane buffer `n`: one value per lane.
    Lanes(usize),
    /// Row buffer `n`: one value per row of the chunk.
    Row(usize),
    /// The same value everywhere (a constant, or computed from constants only).
    Const(f32),
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Code {
    Load { input: usize },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CmpOp),
    Select,
}

/// One instruction: what it computes, from where, into which buffer (a lane buffer in a pass,
/// a row buffer in a stage).
#[derive(Clone, Copy, Debug)]
pub(super) struct Step {
    pub(super) code: Code,
    pub(super) args: [Src; 3],
    pub(super) out: usize,
}

/// A reduction fed in a pass: its operand's lane buffer, its slot, its row buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fold {
    pub(super) op: ReduceOp,
    pub(super) from: usize,
    pub(super) slot: usize,
    pub(super) to: usize,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Pass {
    pub(super) steps: Vec<Step>,
    pub(super) folds: Vec<Fold>,
    /// Row-level instructions evaluated after the pass (its reductions finished).
    pub(super) stage: Vec<Step>,
}

/// A fused kernel made into a program once, when a step is loaded: a flat or rows-case
/// `Program` (`rows`), or a column reduction (`columns`). See the
/// [module docs](self).
#[derive(Clone, Debug)]
pub struct Compiled(Kind);

#[derive(Clone, Debug)]
enum Kind {
    Rows(Program),
    Columns(Columns),
}

impl Compiled {
    /// The program for `k`, or `None` when `k` is outside what compiled kernels cover (see the
    /// [module docs](self)); then the interpreter runs it.
    pub fn new(k: &FusedKernel) -> Option<Compiled> {
        match Program::new(k) {
            Some(p) => Some(Compiled(Kind::Rows(p))),
            None => Columns::new(k).map(|c| Compiled(Kind::Columns(c))),
        }
    }

    /// Bytes of scratch the program uses: never more than [`super::scratch_bytes`] of its
    /// kernel, which is what the planner reserves.
    pub fn scratch_bytes(&self) -> usize {
        match &self.0 {
            Kind::Rows(p) => p.scratch,
            Kind::Columns(c) => c.scratch_bytes(),
        }
    }

    /// Lanes per chunk, and rows per chunk (a column reduction: terms per chunk), for reports
    /// and tests.
    pub fn shape(&self) -> (usize, usize) {
        match &self.0 {
            Kind::Rows(p) => p.shape(),
            Kind::Columns(c) => c.shape(),
        }
    }

    /// Whether this is a column reduction's program (`columns`).
    pub fn is_columns(&self) -> bool {
        matches!(self.0, Kind::Columns(_))
    }

    /// The parts that [`Compiled::run_rows`] can run apart, each on its own: the rows (indices
    /// of the kept axes) of a rows or flat program, the columns of a column reduction.
    pub fn rows(&self) -> usize {
        match &self.0 {
            Kind::Rows(p) => p.rows(),
            Kind::Columns(c) => c.cols(),
        }
    }

    /// [`Compiled::rows`] cut into at most `pieces` ranges of nearly equal size for threads,
    /// each of at least `min_elems` domain elements of `k` (the kernel the program was made
    /// from); `None` when that makes one range only. The ranges depend only on the program,
    /// `pieces` and `min_elems`, and tile the rows in order.
    pub fn row_ranges(
        &self,
        k: &FusedKernel,
        pieces: usize,
        min_elems: usize,
    ) -> Option<Vec<Range<usize>>> {
        let rows = self.rows();
        let numel = k.domain.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
        let n = pieces.min(rows).min(numel / min_elems.max(1));
        (n >= 2).then(|| (0..n).map(|p| rows * p / n..rows * (p + 1) / n).collect())
    }

    /// Runs the program of `k` (the kernel it was made from) as [`super::run`] runs `k`: the
    /// same arguments, checks and results, bit for bit. Buffers whose bytes are not aligned
    /// for f32 are left to the interpreter. Allocates nothing.
    pub fn run(
        &self,
        k: &FusedKernel,
        mem: &mut [u8],
        inputs: &[usize],
        outputs: &[usize],
        scratch: usize,
    ) -> R {
        if inputs.len() != k.inputs.len()
            || outputs.len() != k.outputs.len()
            || misaligned(mem, inputs, outputs)
        {
            return super::run(k, mem, inputs, outputs, scratch);
        }
        self.run_rows(k, mem, inputs, outputs, scratch, 0..self.rows())
    }

    /// Runs rows `rows` of the program of `k` ([`Compiled::rows`]): what [`Compiled::run`]
    /// writes for those rows and nothing else, bit for bit, whatever the other rows. So
    /// threads that each run their own range of rows, each with its own scratch, write
    /// disjoint elements and give the same bits on any number of threads. Buffers must be
    /// aligned for f32 here (else an error: the interpreter cannot run a range of rows).
    ///
    /// The checks and the split of `mem` around the scratch are the same for both kinds of
    /// program, so they are made here once and each program gets the `Arena`.
    pub fn run_rows(
        &self,
        k: &FusedKernel,
        mem: &mut [u8],
        inputs: &[usize],
        outputs: &[usize],
        scratch: usize,
        rows: Range<usize>,
    ) -> R {
        let (out_len, bytes, body) = match &self.0 {
            Kind::Rows(p) => (&p.out_len[..], p.scratch, p.body()),
            Kind::Columns(c) => (c.out_len(), c.scratch_bytes(), c.body()),
        };
        check_buffer_counts(k, inputs, outputs)?;
        if misaligned(mem, inputs, outputs) {
            return Err(KernelError::Internal(
                "a range of rows needs buffers aligned for f32",
            ));
        }
        let mem_len = mem.len();
        let s0 = scratch;
        let s1 = super::scratch_end(scratch, bytes, mem_len)?;
        super::check_inputs(k, inputs, mem_len, s0, s1)?;
        for (j, (&off, &len)) in outputs.iter().zip(out_len).enumerate() {
            let size = if body.out_bool[j] { 1 } else { 4 };
            check_range("output", j, off, len.saturating_mul(size), mem_len, s0, s1)?;
        }
        let (lo, rest) = mem.split_at_mut(s0);
        let (sc, hi) = rest.split_at_mut(bytes);
        let pad = (ALIGN - sc.as_ptr() as usize % ALIGN) % ALIGN;
        let arena = Arena {
            io: Io {
                lo,
                hi,
                s0,
                s1,
                inputs,
                outputs,
            },
            scratch: sc
                .get_mut(pad..)
                .ok_or(KernelError::Internal("compiled scratch"))?,
        };
        match &self.0 {
            Kind::Rows(p) => p.run_rows(arena, rows),
            Kind::Columns(c) => c.run_cols(arena, rows),
        }
    }
}

/// Whether some buffer's bytes are not aligned for f32 in `mem`.
fn misaligned(mem: &[u8], inputs: &[usize], outputs: &[usize]) -> bool {
    let base = mem.as_ptr() as usize;
    inputs
        .iter()
        .chain(outputs)
        .any(|&o| !(base.wrapping_add(o)).is_multiple_of(4))
}

/// Applies a constant-only instruction to constant operands, with the interpreter's functions.
fn fold_const(code: Code, a: f32, b: f32, c: f32) -> f32 {
    match code {
        Code::Load { .. } => f32::NAN,
        Code::Unary(op) => unary_fn(op)(a),
        Code::Binary(op) => binary_fn(op)(a, b),
        Code::Compare(op) => bool_f32(compare_fn(op)(a, b)),
        Code::Select => {
            if a != 0.0 {
                b
            } else {
                c
            }
        }
    }
}

#[inline(always)]
fn bool_f32(b: bool) -> f32 {
    if b {
        1.0
    } else {
        0.0
    }
}

fn unary_fn(op: UnaryOp) -> fn(f32) -> f32 {
    match op {
        UnaryOp::Neg => <f32 as Num>::neg,
        UnaryOp::Exp => <f32 as Float>::exp,
        UnaryOp::Log => <f32 as Float>::ln,
        UnaryOp::Sqrt => <f32 as Float>::sqrt,
        UnaryOp::Tanh => <f32 as Float>::tanh,
        UnaryOp::Recip => <f32 as Float>::recip,
        UnaryOp::Erf => <f32 as Float>::erf,
    }
}

fn binary_fn(op: BinaryOp) -> fn(f32, f32) -> f32 {
    match op {
        BinaryOp::Add => <f32 as Scalar>::add,
        BinaryOp::Sub => <f32 as Num>::sub,
        BinaryOp::Mul => <f32 as Num>::mul,
        BinaryOp::Div => <f32 as Float>::div,
        BinaryOp::Max => <f32 as Scalar>::max,
        BinaryOp::Min => <f32 as Num>::min,
    }
}

fn compare_fn(op: CmpOp) -> fn(f32, f32) -> bool {
    match op {
        CmpOp::Lt => |x, y| x < y,
        CmpOp::Le => |x, y| x <= y,
        CmpOp::Gt => |x, y| x > y,
        CmpOp::Ge => |x, y| x >= y,
        CmpOp::Eq => |x, y| x == y,
        CmpOp::Ne => |x, y| x != y,
    }
}

/// What a compiled kernel computes, whatever the chunks it runs over: the row-level steps
/// before the first pass, the passes (full steps, folds, stages), where each output is, and
/// the lane buffers, row buffers and reduction slots they use. The rows and flat programs
/// ([`Program`]) and the columns programs ([`super::columns`]) run it.
#[derive(Clone, Debug)]
pub(super) struct Body {
    pub(super) stage0: Vec<Step>,
    pub(super) passes: Vec<Pass>,
    /// Per output: its value, and whether it is stored once per row.
    pub(super) outputs: Vec<(Src, bool)>,
    /// Per input and per output: whether it holds bools (else f32).
    pub(super) in_bool: Vec<bool>,
    pub(super) out_bool: Vec<bool>,
    pub(super) lane_bufs: usize,
    pub(super) row_bufs: usize,
    pub(super) slots: usize,
}

impl Body {
    /// The body of `k` (flat: it reduces nothing), or `None` when some value has no place a
    /// compiled kernel can keep it in.
    pub(super) fn of(k: &FusedKernel, flat: bool) -> Option<Body> {
        let n_body = k.body.len();
        let lv = levels(k, flat)?;
        let (row, konst, live, depth) = (&lv.row, &lv.konst, &lv.live, &lv.depth);
        let full = |i: usize| !row[i] && konst[i].is_none();
        let passes = {
            let mut p = usize::from(flat);
            for i in 0..n_body {
                if !live[i] || flat {
                    continue;
                }
                if matches!(k.body[i], Inst::Reduce { .. }) {
                    p = p.max(depth[i]);
                }
                if full(i) && k.outputs.iter().any(|o| o.value == i) {
                    p = p.max(depth[i] + 1);
                }
            }
            p
        };

        // Row buffers: one per live row-level value that is not a constant.
        let mut row_buf = vec![usize::MAX; n_body];
        let mut row_bufs = 0;
        for i in 0..n_body {
            if live[i] && row[i] && konst[i].is_none() {
                row_buf[i] = row_bufs;
                row_bufs += 1;
            }
        }
        let src_row = |j: usize, row_buf: &[usize]| match konst[j] {
            Some(v) => Src::Const(v),
            None => Src::Row(row_buf[j]),
        };

        let (mut out_passes, lane_bufs, last_buf, slots) = build_passes(k, &lv, passes, &row_buf)?;
        // Stages: row-level values of depth s are evaluated before pass s (after the last
        // pass for s = passes), in body order; reductions are finished by their pass.
        let mut stages: Vec<Vec<Step>> = vec![Vec::new(); passes + 1];
        for i in 0..n_body {
            if !(live[i] && row[i] && konst[i].is_none())
                || matches!(k.body[i], Inst::Reduce { .. })
            {
                continue;
            }
            let (ops, c) = super::operands(&k.body[i]);
            let mut args = [Src::Const(0.0); 3];
            for (q, &o) in ops[..c].iter().enumerate() {
                args[q] = src_row(o, &row_buf);
            }
            let s = depth[i].min(passes);
            stages[s].push(Step {
                code: code_of(&k.body[i])?,
                args,
                out: row_buf[i],
            });
        }
        let mut stages = stages.into_iter();
        let stage0 = stages.next().unwrap_or_default();
        for (pass, st) in out_passes.iter_mut().zip(stages) {
            pass.stage = st;
        }
        let mut outputs = Vec::with_capacity(k.outputs.len());
        for o in &k.outputs {
            let v = o.value;
            outputs.push(match konst[v] {
                Some(c) => (Src::Const(c), row[v]),
                None if row[v] => (Src::Row(row_buf[v]), true),
                // Full outputs are in their lane buffer after the last pass's steps.
                None if last_buf[v] != usize::MAX => (Src::Lanes(last_buf[v]), false),
                None => return None,
            });
        }
        if out_passes.iter().any(|p| {
            p.folds
                .iter()
                .any(|f| f.from == usize::MAX || f.to == usize::MAX)
        }) {
            return None;
        }
        let dts = k.dtypes();
        Some(Body {
            stage0,
            passes: out_passes,
            outputs,
            in_bool: k.inputs.iter().map(|i| i.dtype == DType::Bool).collect(),
            out_bool: k
                .outputs
                .iter()
                .map(|o| dts[o.value] == DType::Bool)
                .collect(),
            lane_bufs,
            row_bufs,
            slots,
        })
    }
}

/// The kernel's passes over each row ([`Pass`]: the full values the reductions of each depth
/// need, and in the last pass the full outputs), with the lane buffers they take (reused once a
/// value's last reader in the pass has run), where the last pass leaves each value, and the
/// reductions' slots.
fn build_passes(
    k: &FusedKernel,
    lv: &Levels,
    passes: usize,
    row_buf: &[usize],
) -> Option<(Vec<Pass>, usize, Vec<usize>, usize)> {
    let (row, konst, live, depth) = (&lv.row, &lv.konst, &lv.live, &lv.depth);
    let n_body = k.body.len();
    let full = |i: usize| !row[i] && konst[i].is_none();
    let src_row = |j: usize, row_buf: &[usize]| match konst[j] {
        Some(v) => Src::Const(v),
        None => Src::Row(row_buf[j]),
    };
    // Passes: pass p evaluates, in body order, the full values that the reductions of
    // depth p + 1 (and in the last pass, the full outputs) need; lane buffers are reused
    // once a value's last reader in the pass has run.
    let mut out_passes = Vec::with_capacity(passes);
    let mut lane_bufs = 0usize;
    let mut last_buf = vec![usize::MAX; n_body];
    let mut slots = 0usize;
    for p in 0..passes {
        let last = p + 1 == passes;
        let mut need = vec![false; n_body];
        let mut folds_src = Vec::new();
        for i in (0..n_body).rev() {
            if !live[i] {
                continue;
            }
            if let Inst::Reduce { x, .. } = k.body[i] {
                if depth[i] == p + 1 {
                    need[x] = true;
                    folds_src.push(i);
                }
            }
            if last && full(i) && k.outputs.iter().any(|o| o.value == i) {
                need[i] = true;
            }
            if need[i] && full(i) {
                let (ops, c) = super::operands(&k.body[i]);
                for &o in &ops[..c] {
                    if full(o) {
                        need[o] = true;
                    }
                }
            }
        }
        folds_src.reverse();
        let list: Vec<usize> = (0..n_body).filter(|&i| need[i] && full(i)).collect();
        // Last reader of each value within the pass (usize::MAX: read after the steps).
        let mut last_use = vec![0usize; n_body];
        for (pos, &i) in list.iter().enumerate() {
            let (ops, c) = super::operands(&k.body[i]);
            for &o in &ops[..c] {
                last_use[o] = pos;
            }
        }
        for &r in &folds_src {
            if let Inst::Reduce { x, .. } = k.body[r] {
                last_use[x] = usize::MAX;
            }
        }
        if last {
            for o in &k.outputs {
                last_use[o.value] = usize::MAX;
            }
        }
        let mut buf = vec![usize::MAX; n_body];
        let mut free: Vec<usize> = Vec::new();
        let mut count = 0usize;
        let mut steps = Vec::with_capacity(list.len());
        for (pos, &i) in list.iter().enumerate() {
            let out = free.pop().unwrap_or_else(|| {
                count += 1;
                count - 1
            });
            buf[i] = out;
            let (ops, c) = super::operands(&k.body[i]);
            let mut args = [Src::Const(0.0); 3];
            for (q, &o) in ops[..c].iter().enumerate() {
                args[q] = if full(o) {
                    Src::Lanes(buf[o])
                } else {
                    src_row(o, row_buf)
                };
            }
            steps.push(Step {
                code: code_of(&k.body[i])?,
                args,
                out,
            });
            for &o in &ops[..c] {
                if full(o) && last_use[o] == pos && !free.contains(&buf[o]) {
                    free.push(buf[o]);
                }
            }
        }
        lane_bufs = lane_bufs.max(count);
        if last {
            last_buf = buf.clone();
        }
        let mut folds = Vec::with_capacity(folds_src.len());
        for (q, &r) in folds_src.iter().enumerate() {
            let Inst::Reduce { op, x } = k.body[r] else {
                return None;
            };
            slots = slots.max(q + 1);
            folds.push(Fold {
                op,
                from: buf[x],
                slot: q,
                to: row_buf[r],
            });
        }
        out_passes.push(Pass {
            steps,
            folds,
            stage: Vec::new(),
        });
    }
    Some((out_passes, lane_bufs, last_buf, slots))
}

/// The axes of a flat or rows-case program ([`super::rows`]), axes of size 1 dropped: the
/// inner axes (the innermost ones every input walks with one stride; in a reduction, exactly
/// the trailing run of reduced axes), the row axes (the kept ones), the run axes (the reduced
/// ones outside the inner ones, wherever they lie among the kept ones), and whether the kernel
/// is flat (reduces nothing); `None` where no such split exists (the innermost axis kept in a
/// reduction: a column reduction; an input that walks the inner axes with several strides).
pub(super) type Axes = (Vec<usize>, Vec<usize>, Vec<usize>, bool);

pub(super) fn chunk_axes(k: &FusedKernel) -> Option<Axes> {
    let dims = &k.domain;
    // Axes of size 1 change no index: drop them. The chunk axes are the innermost ones.
    let eff: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] != 1).collect();
    let red = |d: usize| k.reduce_axes.contains(&d);
    let reduced: Vec<usize> = eff.iter().copied().filter(|&d| red(d)).collect();
    let flat = reduced.is_empty();
    if flat && k.body.iter().any(|i| matches!(i, Inst::Reduce { .. })) {
        return None;
    }
    let composes = |q: usize, axes: &[usize]| {
        let s = &k.inputs[q].access.strides;
        axes.windows(2)
            .all(|w| s[w[1]].checked_mul(dims[w[1]]) == Some(s[w[0]]))
    };
    let inner: Vec<usize> = if flat {
        // The longest innermost run of axes every input walks with one stride.
        let mut t = eff.len().min(1);
        while t < eff.len() {
            let axes = &eff[eff.len() - t - 1..];
            if !(0..k.inputs.len()).all(|q| composes(q, axes)) {
                break;
            }
            t += 1;
        }
        eff[eff.len() - t..].to_vec()
    } else {
        // Rows: the trailing run of reduced axes, as the interpreter's chunk axes (its runs
        // fold along all of them at once, so every input must walk them with one stride).
        let t = eff.iter().rev().take_while(|&&d| red(d)).count();
        if t == 0 {
            return None;
        }
        let inner = eff[eff.len() - t..].to_vec();
        if !(0..k.inputs.len()).all(|q| composes(q, &inner)) {
            return None;
        }
        inner
    };
    let rest = &eff[..eff.len() - inner.len()];
    let outer: Vec<usize> = rest.iter().copied().filter(|&d| !red(d)).collect();
    let runs: Vec<usize> = rest.iter().copied().filter(|&d| red(d)).collect();
    Some((inner, outer, runs, flat))
}

/// Whether `k` checks, has elements and outputs, and every value f32 ([`f32_only`]): what both
/// kinds of program ask before they look at the kernel's case.
pub(super) fn covered(k: &FusedKernel) -> bool {
    k.check().is_ok() && !k.domain.contains(&0) && !k.outputs.is_empty() && f32_only(k)
}

/// Whether every value of `k` is f32 but its bools (compares, loads of bool inputs), which
/// only selects read, as their condition, and outputs store: what compiled kernels cover.
pub(super) fn f32_only(k: &FusedKernel) -> bool {
    let dts = k.dtypes();
    // Values are f32; bools (compares, loads) are read only by selects, as their condition.
    for (i, inst) in k.body.iter().enumerate() {
        let ok = match *inst {
            Inst::Load { input } => matches!(k.inputs[input].dtype, DType::F32 | DType::Bool),
            Inst::Const { dtype, .. } => dtype == DType::F32,
            Inst::Unary { .. } | Inst::Binary { .. } | Inst::Select { .. } => dts[i] == DType::F32,
            Inst::Compare { a, .. } => dts[a] == DType::F32,
            Inst::Reduce { .. } => dts[i] == DType::F32,
            Inst::Index { .. } | Inst::Convert { .. } => false,
        };
        if !ok {
            return false;
        }
        let (ops, c) = super::operands(inst);
        for (q, &o) in ops[..c].iter().enumerate() {
            let cond = matches!(inst, Inst::Select { .. }) && q == 0;
            if (dts[o] == DType::Bool) != cond {
                return false;
            }
        }
    }
    k.outputs
        .iter()
        .all(|o| matches!(dts[o.value], DType::F32 | DType::Bool))
}

/// What the analysis of a kernel's body knows of each value: row-level (one value per row;
/// flat kernels have none: every value is per element), a constant, live (an output reads it),
/// and depth (reductions one deeper than their operand).
struct Levels {
    row: Vec<bool>,
    konst: Vec<Option<f32>>,
    live: Vec<bool>,
    depth: Vec<usize>,
}

/// Each value's levels ([`Levels`]), or `None` where a reduction reads a row-level value or a
/// constant (its value would need broadcasting over the row's lanes: left to the interpreter).
fn levels(k: &FusedKernel, flat: bool) -> Option<Levels> {
    let n_body = k.body.len();
    let row: Vec<bool> = if flat {
        vec![false; n_body]
    } else {
        k.row_levels()
    };
    let mut konst: Vec<Option<f32>> = vec![None; n_body];
    let mut live = vec![false; n_body];
    let mut depth = vec![0usize; n_body];
    for o in &k.outputs {
        live[o.value] = true;
    }
    for i in (0..n_body).rev() {
        if live[i] {
            let (ops, c) = super::operands(&k.body[i]);
            for &o in &ops[..c] {
                live[o] = true;
            }
        }
    }
    for (i, inst) in k.body.iter().enumerate() {
        let (ops, c) = super::operands(inst);
        let d = ops[..c].iter().map(|&o| depth[o]).max().unwrap_or(0);
        depth[i] = if matches!(inst, Inst::Reduce { .. }) {
            d + 1
        } else {
            d
        };
        konst[i] = match *inst {
            Inst::Const { value, .. } => Some(value as f32),
            Inst::Load { .. } | Inst::Reduce { .. } | Inst::Index { .. } => None,
            _ => {
                let vals: Vec<Option<f32>> = ops[..c].iter().map(|&o| konst[o]).collect();
                if vals.iter().all(|v| v.is_some()) {
                    let v = |q: usize| vals.get(q).copied().flatten().unwrap_or(0.0);
                    Some(fold_const(code_of(inst)?, v(0), v(1), v(2)))
                } else {
                    None
                }
            }
        };
        // A reduction of a row-level value or a constant would need its value broadcast
        // over the row's lanes: left to the interpreter.
        if let Inst::Reduce { x, .. } = *inst {
            if row[x] || konst[x].is_some() {
                return None;
            }
        }
    }
    Some(Levels {
        row,
        konst,
        live,
        depth,
    })
}

fn code_of(inst: &Inst) -> Option<Code> {
    Some(match *inst {
        Inst::Load { input } => Code::Load { input },
        Inst::Unary { op, .. } => Code::Unary(op),
        Inst::Binary { op, .. } => Code::Binary(op),
        Inst::Compare { op, .. } => Code::Compare(op),
        Inst::Select { .. } => Code::Select,
        Inst::Const { .. } | Inst::Index { .. } | Inst::Convert { .. } | Inst::Reduce { .. } => {
            return None
        }
    })
}

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

/// The arena of a compiled program's run once [`Compiled::run`] has checked it: the bytes
/// outside the scratch, where the inputs and outputs are, and the scratch from its first
/// [`ALIGN`]ed byte.
pub(super) struct Arena<'m> {
    pub(super) io: Io<'m>,
    pub(super) scratch: &'m mut [u8],
}

/// The arena outside the scratch `[s0, s1)` (`lo` is `[0, s0)`, `hi` is from `s1` on), and
/// the offsets of the kernel's inputs and outputs in it.
pub(super) struct Io<'m> {
    lo: &'m mut [u8],
    hi: &'m mut [u8],
    s0: usize,
    s1: usize,
    inputs: &'m [usize],
    outputs: &'m [usize],
}

impl Io<'_> {
    /// The `n` f32 of input `q`.
    pub(super) fn input(&self, q: usize, n: usize) -> R<&[f32]> {
        let a = *self
            .inputs
            .get(q)
            .ok_or(KernelError::Internal("input index"))?;
        let b = super::plan::region(
            &*self.lo,
            &*self.hi,
            self.s0,
            self.s1,
            a,
            n.saturating_mul(4),
        )?;
        <[f32]>::ref_from_bytes(b).map_err(|_| KernelError::Internal("input misaligned"))
    }

    /// The `n` elements of input `q`: f32, or bools (one byte each) where `bool`.
    pub(super) fn source(&self, q: usize, n: usize, bool: bool) -> R<Source<'_>> {
        if !bool {
            return Ok(Source::F32(self.input(q, n)?));
        }
        let a = *self
            .inputs
            .get(q)
            .ok_or(KernelError::Internal("input index"))?;
        let b = super::plan::region(&*self.lo, &*self.hi, self.s0, self.s1, a, n)?;
        Ok(Source::Bool(b))
    }

    /// The `n` f32 of output `o`.
    pub(super) fn output(&mut self, o: usize, n: usize) -> R<&mut [f32]> {
        let a = *self
            .outputs
            .get(o)
            .ok_or(KernelError::Internal("output index"))?;
        let (s0, s1, bytes) = (self.s0, self.s1, n.saturating_mul(4));
        let b = super::plan::region(&mut *self.lo, &mut *self.hi, s0, s1, a, bytes)?;
        <[f32]>::mut_from_bytes(b).map_err(|_| KernelError::Internal("output misaligned"))
    }

    /// The `n` elements of output `o`: f32, or bools (one byte each) where `bool`.
    pub(super) fn dest(&mut self, o: usize, n: usize, bool: bool) -> R<Dest<'_>> {
        if !bool {
            return Ok(Dest::F32(self.output(o, n)?));
        }
        let a = *self
            .outputs
            .get(o)
            .ok_or(KernelError::Internal("output index"))?;
        let (s0, s1) = (self.s0, self.s1);
        let b = super::plan::region(&mut *self.lo, &mut *self.hi, s0, s1, a, n)?;
        Ok(Dest::Bool(b))
    }

    /// Stores the row-level outputs among `outputs` (those marked `true`), `total` elements
    /// each, at `start .. start + n`: each from its row buffer (buffer `b` at `b * stride` in
    /// `rows`) or its constant. A rows program's group of rows and a columns program's block
    /// of columns both end so.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn store_rows(
        &mut self,
        outputs: &[(Src, bool)],
        out_bool: &[bool],
        rows: &[f32],
        stride: usize,
        total: usize,
        start: usize,
        n: usize,
    ) -> R {
        for (o, &(src, per_row)) in outputs.iter().enumerate() {
            if !per_row {
                continue;
            }
            let mut d = self.dest(o, total, out_bool.get(o) == Some(&true))?;
            match src {
                Src::Row(b) => d.put(start, super::sub(rows, b * stride, n)?)?,
                Src::Const(c) => d.fill(start, n, c)?,
                Src::Lanes(_) => return Err(KernelError::Internal("full value stored per row")),
            }
        }
        Ok(())
    }
}

/// An input's elements: f32, or bools (bytes, 0 or 1) that programs hold as 0.0 and 1.0 (what
/// compares give), which only selects read, as their condition.
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    F32(&'a [f32]),
    Bool(&'a [u8]),
}

impl Source<'_> {
    /// Element `i`, as a program holds it.
    pub(super) fn get(&self, i: usize) -> Option<f32> {
        match self {
            Source::F32(s) => s.get(i).copied(),
            Source::Bool(s) => s.get(i).map(|&b| bool_f32(b != 0)),
        }
    }
}

/// An output's elements: f32, or bools (a byte each: 1 where the lane is not 0.0).
pub(super) enum Dest<'a> {
    F32(&'a mut [f32]),
    Bool(&'a mut [u8]),
}

impl Dest<'_> {
    /// Stores `v` at elements `at ..`.
    pub(super) fn put(&mut self, at: usize, v: &[f32]) -> R {
        match self {
            Dest::F32(d) => super::sub_mut(d, at, v.len())?.copy_from_slice(v),
            Dest::Bool(d) => {
                for (d, &x) in super::sub_mut(d, at, v.len())?.iter_mut().zip(v) {
                    *d = u8::from(x != 0.0);
                }
            }
        }
        Ok(())
    }

    /// Stores `c` at elements `at .. at + n`.
    pub(super) fn fill(&mut self, at: usize, n: usize, c: f32) -> R {
        match self {
            Dest::F32(d) => super::sub_mut(d, at, n)?.fill(c),
            Dest::Bool(d) => super::sub_mut(d, at, n)?.fill(u8::from(c != 0.0)),
        }
        Ok(())
    }
}

/// Buffer `i` of the `w`-long buffers in `bufs` split from the others for a step that writes
/// its first `len` elements and reads the others: the buffers before it, its elements, the
/// buffers after it, and where it ends (the gap [`other`] steps over). `what` names the
/// buffers in the error when `i` is past them.
#[allow(clippy::type_complexity)]
pub(super) fn step_out<'b>(
    bufs: &'b mut [f32],
    i: usize,
    w: usize,
    len: usize,
    what: &'static str,
) -> R<(&'b [f32], &'b mut [f32], &'b [f32], usize)> {
    let end = i * w + w;
    if end > bufs.len() {
        return Err(KernelError::Internal(what));
    }
    let (before, rest) = bufs.split_at_mut(i * w);
    let (own, after) = rest.split_at_mut(w);
    let out = own.get_mut(..len).ok_or(KernelError::Internal(what))?;
    Ok((before, out, after, end))
}

/// Calls `f(start, n)` on the blocks of `size` (the last one shorter) that cover `0 .. total`,
/// in order: a rows program's groups of rows, a columns program's blocks of columns.
pub(super) fn in_blocks(total: usize, size: usize, mut f: impl FnMut(usize, usize) -> R) -> R {
    let mut start = 0;
    while start < total {
        let n = size.min(total - start);
        f(start, n)?;
        start += n;
    }
    Ok(())
}
