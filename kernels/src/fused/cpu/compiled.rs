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
//! Kernels whose values are all `f32` (compares give bools that only selects read), with loads,
//! constants, unary, binary, compare and select instructions and sum or max reductions, in the
//! interpreter's flat case or its rows case with every reduced axis of size > 1 inside the kept
//! ones (one contiguous run per row), and whose every input reaches the innermost axes of the
//! chunk with a single stride; and column reductions whose reduced axes all come before their
//! kept ones, as the programs of `columns`. [`Compiled::new`] says `None` for the
//! rest, which the interpreter runs as before: indices, converts, other dtypes (bf16
//! included), other column reductions, empty domains, and kernels whose program would not fit
//! in the scratch the planner reserved for the interpreter ([`super::scratch_bytes`]), which
//! is all a compiled kernel uses.
//!
//! # The same bits
//! Every value is computed by the same scalar functions the interpreter calls
//! ([`crate::cpu::Float`], [`crate::cpu::Num`], [`crate::cpu::Scalar`]), and every reduction of a
//! row folds through the interpreter's own accumulation functions (`acc_run` and `slot_op`: the
//! eight interleaved partials, blocks of [`RUN_BLOCK`](crate::cpu::reduce::RUN_BLOCK) and the cascade), one row at a time,
//! whichever rows share a chunk. Elementwise IEEE arithmetic gives the same result vectorised
//! or not, so a compiled kernel writes the interpreter's bits; the tests hold it to that on
//! random kernels, on their pieces for 1, 2 and 3 threads, and on whole training steps.
//!
//! # In place
//! As in the interpreter: within a chunk every load happens before any store, and full outputs
//! are stored in the last pass, so an output written over an input that
//! [`FusedKernel::can_write_over`] allows is read before it is overwritten.

use super::columns::Columns;
use super::reduce::{acc_run, slot_op, Runs, SlotStep};
use super::{check_range, scratch_bytes, KernelError, ALIGN, R, RUNS, SLOT};
use crate::cpu::{Float, Num, Scalar};
use crate::fused::{FusedKernel, Inst};
use crate::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use zerocopy::{FromBytes, IntoBytes};

/// The most lanes a chunk holds.
pub const MAX_LANES: usize = 1024;
/// Lane counts tried, largest first: the largest whose scratch fits is taken.
pub(super) const LANE_CHOICES: [usize; 7] = [1024, 512, 256, 128, 64, 32, 16];
/// The most rows one chunk holds (bounds the per-row slots and bases).
const MAX_ROWS: usize = 128;

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
/// `Program` (this module), or a column reduction (`columns`). See the
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
            Kind::Rows(p) => p.scratch_bytes(),
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

    /// Runs the program of `k` (the kernel it was made from) as [`super::run`] runs `k`: the
    /// same arguments, checks and results, bit for bit. Buffers whose bytes are not aligned
    /// for f32 are left to the interpreter. Allocates nothing.
    ///
    /// The checks and the split of `mem` around the scratch are the same for both kinds of
    /// program, so they are made here once and each program gets the `Arena`.
    pub fn run(
        &self,
        k: &FusedKernel,
        mem: &mut [u8],
        inputs: &[usize],
        outputs: &[usize],
        scratch: usize,
    ) -> R {
        let (out_len, bytes) = match &self.0 {
            Kind::Rows(p) => (&p.out_len[..], p.scratch),
            Kind::Columns(c) => (c.out_len(), c.scratch_bytes()),
        };
        if inputs.len() != k.inputs.len() || outputs.len() != k.outputs.len() {
            return super::run(k, mem, inputs, outputs, scratch);
        }
        let mem_len = mem.len();
        let s0 = scratch;
        let s1 = super::scratch_end(scratch, bytes, mem_len)?;
        super::check_inputs(k, inputs, mem_len, s0, s1)?;
        for (j, (&off, &len)) in outputs.iter().zip(out_len).enumerate() {
            check_range("output", j, off, len.saturating_mul(4), mem_len, s0, s1)?;
        }
        let base = mem.as_ptr() as usize;
        let misaligned = inputs
            .iter()
            .chain(outputs)
            .any(|&o| !(base.wrapping_add(o)).is_multiple_of(4));
        if misaligned {
            return super::run(k, mem, inputs, outputs, scratch);
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
            Kind::Rows(p) => p.run(arena),
            Kind::Columns(c) => c.run(arena),
        }
    }
}

/// A flat or rows-case fused kernel made into a program once; see the [module docs](self).
#[derive(Clone, Debug)]
pub(super) struct Program {
    /// Row-level instructions evaluated before the first pass.
    stage0: Vec<Step>,
    passes: Vec<Pass>,
    /// Per output: its value, and whether it is stored once per row.
    outputs: Vec<(Src, bool)>,
    /// Per input: its offset, its strides over the outer axes, and its step along the chunk.
    in_offset: Vec<usize>,
    in_outer: Vec<Vec<usize>>,
    in_step: Vec<usize>,
    in_len: Vec<usize>,
    /// Per output: its elements ([`FusedKernel::output_len`], which allocates, asked once).
    out_len: Vec<usize>,
    /// Sizes of the outer axes (rows), outermost first.
    outer: Vec<usize>,
    rows: usize,
    /// Elements along the chunk axes of one row (a row's run, or a flat kernel's segment).
    n: usize,
    lanes: usize,
    /// Rows per chunk (1 when a row is longer than `lanes`).
    group: usize,
    lane_bufs: usize,
    row_bufs: usize,
    slots: usize,
    scratch: usize,
}

/// The layout of the scratch: bases, lane buffers, row buffers, slots (byte offsets from the
/// aligned start) and the bytes needed, alignment slack included.
struct Carve {
    lanes_at: usize,
    rows_at: usize,
    slots_at: usize,
    end: usize,
}

fn carve(
    inputs: usize,
    group: usize,
    lanes: usize,
    lane_bufs: usize,
    row_bufs: usize,
    slots: usize,
) -> Option<Carve> {
    let bases = inputs.checked_mul(group)?.checked_mul(size_of::<usize>())?;
    let lanes_at = bases.checked_next_multiple_of(ALIGN)?;
    let rows_at = lanes_at.checked_add(lane_bufs.checked_mul(lanes)?.checked_mul(4)?)?;
    let slots_at = rows_at
        .checked_add(row_bufs.checked_mul(group)?.checked_mul(4)?)?
        .checked_next_multiple_of(ALIGN)?;
    let end = slots_at.checked_add(slots.checked_mul(group)?.checked_mul(SLOT * 4)?)?;
    Some(Carve {
        lanes_at,
        rows_at,
        slots_at,
        end,
    })
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

impl Program {
    /// The program for `k`, or `None` when `k` is outside what compiled kernels cover (see the
    /// [module docs](self)); then the interpreter runs it.
    pub(super) fn new(k: &FusedKernel) -> Option<Program> {
        if !covered(k) {
            return None;
        }
        let dims = &k.domain;
        let (inner, outer, flat) = chunk_axes(k)?;
        let n = inner
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(dims[d]))?;
        let rows = outer
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(dims[d]))?;

        let Body {
            stage0,
            passes: out_passes,
            outputs,
            lane_bufs,
            row_bufs,
            slots,
        } = Body::of(k, flat)?;

        // Inputs: offset, strides over the outer axes, one step along the chunk.
        let in_offset = k.inputs.iter().map(|i| i.access.offset).collect();
        let in_outer = k
            .inputs
            .iter()
            .map(|i| outer.iter().map(|&a| i.access.strides[a]).collect())
            .collect();
        let in_step = k
            .inputs
            .iter()
            .map(|i| inner.last().map_or(0, |&a| i.access.strides[a]))
            .collect();
        let in_len = k.inputs.iter().map(|i| i.len).collect();
        let outer_dims: Vec<usize> = outer.iter().map(|&a| dims[a]).collect();

        // The most lanes whose scratch fits in what the planner reserved.
        let avail = scratch_bytes(k);
        let mut pick = None;
        for &lanes in &LANE_CHOICES {
            let group = if n <= lanes {
                (lanes / n).clamp(1, MAX_ROWS)
            } else {
                1
            };
            let Some(c) = carve(k.inputs.len(), group, lanes, lane_bufs, row_bufs, slots) else {
                continue;
            };
            if c.end.checked_add(ALIGN).is_some_and(|e| e <= avail) {
                pick = Some((lanes, group, c.end + ALIGN));
                break;
            }
        }
        let (lanes, group, scratch) = pick?;
        Some(Program {
            stage0,
            passes: out_passes,
            outputs,
            in_offset,
            in_outer,
            in_step,
            in_len,
            out_len: (0..k.outputs.len()).map(|j| k.output_len(j)).collect(),
            outer: outer_dims,
            rows,
            n,
            lanes,
            group: group.min(rows.max(1)),
            lane_bufs,
            row_bufs,
            slots,
            scratch,
        })
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
        Some(Body {
            stage0,
            passes: out_passes,
            outputs,
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

/// The chunk's axes (the innermost ones every input walks with one stride; for a reduction,
/// exactly its reduced axes) and the outer ones, axes of size 1 dropped, and whether the kernel
/// is flat (reduces nothing); `None` where no such split exists.
fn chunk_axes(k: &FusedKernel) -> Option<(Vec<usize>, Vec<usize>, bool)> {
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
        // Rows: the reduced axes are exactly the innermost ones (one run per row).
        let t = reduced.len();
        if eff[eff.len() - t..] != reduced[..] {
            return None;
        }
        if !(0..k.inputs.len()).all(|q| composes(q, &reduced)) {
            return None;
        }
        reduced
    };
    let outer: Vec<usize> = eff[..eff.len() - inner.len()].to_vec();
    Some((inner, outer, flat))
}

/// Whether `k` checks, has elements and outputs, and every value f32 ([`f32_only`]): what both
/// kinds of program ask before they look at the kernel's case.
pub(super) fn covered(k: &FusedKernel) -> bool {
    k.check().is_ok() && !k.domain.contains(&0) && !k.outputs.is_empty() && f32_only(k)
}

/// Whether every value of `k` is f32, and its compares give bools that only selects read, as
/// their condition: what compiled kernels cover.
pub(super) fn f32_only(k: &FusedKernel) -> bool {
    let dts = k.dtypes();
    // Values are f32; compares give bools that only selects read, as their condition.
    for (i, inst) in k.body.iter().enumerate() {
        let ok = match *inst {
            Inst::Load { input } => k.inputs[input].dtype == DType::F32,
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
    k.outputs.iter().all(|o| dts[o.value] == DType::F32)
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

pub(super) fn unary_lanes(op: UnaryOp, a: Val<'_>, o: &mut [f32]) {
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

pub(super) fn binary_lanes(op: BinaryOp, a: Val<'_>, b: Val<'_>, o: &mut [f32]) {
    match op {
        BinaryOp::Add => map2(a, b, o, <f32 as Scalar>::add),
        BinaryOp::Sub => map2(a, b, o, <f32 as Num>::sub),
        BinaryOp::Mul => map2(a, b, o, <f32 as Num>::mul),
        BinaryOp::Div => map2(a, b, o, <f32 as Float>::div),
        BinaryOp::Max => map2(a, b, o, <f32 as Scalar>::max),
        BinaryOp::Min => map2(a, b, o, <f32 as Num>::min),
    }
}

pub(super) fn compare_lanes(op: CmpOp, a: Val<'_>, b: Val<'_>, o: &mut [f32]) {
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
pub(super) fn select_lanes(c: Val<'_>, a: Val<'_>, b: Val<'_>, o: &mut [f32]) {
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

/// A stage's operand over the group's `g` rows: a row buffer or a constant.
fn row_val<'a>(
    s: Src,
    before: &'a [f32],
    after: &'a [f32],
    end: usize,
    gw: usize,
    g: usize,
) -> R<Val<'a>> {
    Ok(match s {
        Src::Const(c) => Val::One(c),
        Src::Row(b) => Val::Lanes(super::sub(other(before, after, end, gw, b)?, 0, g)?),
        Src::Lanes(_) => return Err(KernelError::Internal("lane value in a stage")),
    })
}

/// The buffers a full step reads: row buffers, and the lane buffers around the one it writes.
struct Around<'a> {
    rows: &'a [f32],
    before: &'a [f32],
    after: &'a [f32],
    end: usize,
    lanes: usize,
    group: usize,
}

impl<'a> Around<'a> {
    /// Operand `s` for row `j` of the chunk, over `seg` lanes from lane `from`.
    fn val(&self, s: Src, j: usize, from: usize, seg: usize) -> R<Val<'a>> {
        Ok(match s {
            Src::Const(c) => Val::One(c),
            Src::Row(b) => Val::One(
                *self
                    .rows
                    .get(b * self.group + j)
                    .ok_or(KernelError::Internal("row buffer"))?,
            ),
            Src::Lanes(b) => Val::Lanes(super::sub(
                other(self.before, self.after, self.end, self.lanes, b)?,
                from,
                seg,
            )?),
        })
    }
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

    /// Stores the row-level outputs among `outputs` (those marked `true`), `total` elements
    /// each, at `start .. start + n`: each from its row buffer (buffer `b` at `b * stride` in
    /// `rows`) or its constant. A rows program's group of rows and a columns program's block
    /// of columns both end so.
    pub(super) fn store_rows(
        &mut self,
        outputs: &[(Src, bool)],
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
            let d = super::sub_mut(self.output(o, total)?, start, n)?;
            match src {
                Src::Row(b) => d.copy_from_slice(super::sub(rows, b * stride, n)?),
                Src::Const(c) => d.fill(c),
                Src::Lanes(_) => return Err(KernelError::Internal("full value stored per row")),
            }
        }
        Ok(())
    }
}

/// What a run works on: the arena outside the scratch, and the scratch's parts.
struct Work<'m> {
    io: Io<'m>,
    bases: &'m mut [usize],
    lanes: &'m mut [f32],
    rows: &'m mut [f32],
    slots: &'m mut [f32],
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

impl Program {
    /// Bytes of scratch the program uses: never more than [`super::scratch_bytes`] of its
    /// kernel, which is what the planner reserves.
    pub(super) fn scratch_bytes(&self) -> usize {
        self.scratch
    }

    /// Lanes per chunk, and rows per chunk (for reports and tests).
    pub(super) fn shape(&self) -> (usize, usize) {
        (self.lanes, self.group)
    }

    /// Runs the program on the arena that [`Compiled::run`] checked and split, a group of
    /// rows at a time.
    fn run(&self, a: Arena<'_>) -> R {
        let mut w = self.work(a)?;
        in_blocks(self.rows, self.group, |r0, g| self.group_run(&mut w, r0, g))
    }

    /// The scratch of the arena, carved into this program's parts.
    fn work<'m>(&self, a: Arena<'m>) -> R<Work<'m>> {
        let c = carve(
            self.in_len.len(),
            self.group,
            self.lanes,
            self.lane_bufs,
            self.row_bufs,
            self.slots,
        )
        .ok_or(KernelError::Internal("compiled scratch"))?;
        let sc = super::sub_mut(a.scratch, 0, c.end)?;
        let (b_bases, rest) = sc.split_at_mut(c.lanes_at);
        let (b_lanes, rest) = rest.split_at_mut(c.rows_at - c.lanes_at);
        let (b_rows, b_slots) = rest.split_at_mut(c.slots_at - c.rows_at);
        let bad = || KernelError::Internal("compiled scratch misaligned");
        let n_bases = self.in_len.len() * self.group;
        let bases = <[usize]>::mut_from_bytes(&mut b_bases[..n_bases * size_of::<usize>()])
            .map_err(|_| bad())?;
        let lanes = <[f32]>::mut_from_bytes(b_lanes).map_err(|_| bad())?;
        let rows_b = &mut b_rows[..self.row_bufs * self.group * 4];
        let rows = <[f32]>::mut_from_bytes(rows_b).map_err(|_| bad())?;
        let slots = <[f32]>::mut_from_bytes(b_slots).map_err(|_| bad())?;
        Ok(Work {
            io: a.io,
            bases,
            lanes,
            rows,
            slots,
        })
    }

    /// Rows `r0 .. r0 + g`: their bases, stages, passes and stores.
    fn group_run(&self, w: &mut Work<'_>, r0: usize, g: usize) -> R {
        // Each input's element index at the start of each row of the group.
        let ni = self.in_len.len();
        for q in 0..ni {
            let strides = &self.in_outer[q];
            for j in 0..g {
                let mut r = r0 + j;
                let mut at = self.in_offset[q];
                for (d, &s) in self.outer.iter().zip(strides).rev() {
                    at = at.wrapping_add((r % d).wrapping_mul(s));
                    r /= d;
                }
                w.bases[q * self.group + j] = at;
            }
        }
        self.stage(w, &self.stage0, g)?;
        let n_passes = self.passes.len();
        let chunk = self.n.min(self.lanes);
        for (p, pass) in self.passes.iter().enumerate() {
            let last = p + 1 == n_passes;
            for f in &pass.folds {
                for j in 0..g {
                    let s = self.slot_mut(w, f.slot, j)?;
                    slot_op::<f32>(f.op, s.as_mut_bytes(), SlotStep::StartRow, self.runs())?;
                    slot_op::<f32>(f.op, s.as_mut_bytes(), SlotStep::StartRun, self.runs())?;
                }
            }
            let mut p0 = 0;
            while p0 < self.n {
                let len = chunk.min(self.n - p0);
                for st in &pass.steps {
                    self.full_step(w, st, g, len, p0)?;
                }
                for f in &pass.folds {
                    for j in 0..g {
                        let xs = super::sub(w.lanes, f.from * self.lanes + j * len, len)?;
                        let s = super::sub_mut(w.slots, (f.slot * self.group + j) * SLOT, SLOT)?;
                        acc_run::<f32>(f.op, xs.as_bytes(), s.as_mut_bytes(), p0, 0)?;
                    }
                }
                if last {
                    for (o, &(src, per_row)) in self.outputs.iter().enumerate() {
                        if per_row {
                            continue;
                        }
                        let dst = w.io.output(o, self.rows * self.n)?;
                        let at = r0 * self.n + p0;
                        if len == self.n {
                            let d = super::sub_mut(dst, at, g * len)?;
                            match src {
                                Src::Lanes(b) => {
                                    d.copy_from_slice(super::sub(w.lanes, b * self.lanes, g * len)?)
                                }
                                Src::Const(c) => d.fill(c),
                                Src::Row(_) => {
                                    return Err(KernelError::Internal("row value stored full"))
                                }
                            }
                        } else {
                            let d = super::sub_mut(dst, at, len)?;
                            match src {
                                Src::Lanes(b) => {
                                    d.copy_from_slice(super::sub(w.lanes, b * self.lanes, len)?)
                                }
                                Src::Const(c) => d.fill(c),
                                Src::Row(_) => {
                                    return Err(KernelError::Internal("row value stored full"))
                                }
                            }
                        }
                    }
                }
                p0 += len;
            }
            for f in &pass.folds {
                for j in 0..g {
                    let s = self.slot_mut(w, f.slot, j)?;
                    slot_op::<f32>(f.op, s.as_mut_bytes(), SlotStep::EndRun, self.runs())?;
                    slot_op::<f32>(f.op, s.as_mut_bytes(), SlotStep::EndRow, self.runs())?;
                    let v = s[RUNS];
                    *w.rows
                        .get_mut(f.to * self.group + j)
                        .ok_or(KernelError::Internal("row buffer"))? = v;
                }
            }
            self.stage(w, &pass.stage, g)?;
        }
        w.io.store_rows(&self.outputs, w.rows, self.group, self.rows, r0, g)
    }

    /// The rows case's run bookkeeping: one run of `n` elements per row.
    fn runs(&self) -> Runs {
        Runs {
            multi: false,
            index: 0,
            count: 1,
            len: self.n,
        }
    }

    fn slot_mut<'w>(&self, w: &'w mut Work<'_>, slot: usize, j: usize) -> R<&'w mut [f32]> {
        super::sub_mut(w.slots, (slot * self.group + j) * SLOT, SLOT)
    }

    /// Row-level steps over the group's `g` rows (operands: row buffers and constants).
    fn stage(&self, w: &mut Work<'_>, steps: &[Step], g: usize) -> R {
        let gw = self.group;
        for st in steps {
            let (before, out, after, end) = step_out(w.rows, st.out, gw, g, "row buffer")?;
            let val = |s: Src| row_val(s, before, after, end, gw, g);
            match st.code {
                Code::Load { input } => {
                    let len = self.in_len[input];
                    let src = w.io.input(input, len)?;
                    for (j, o) in out.iter_mut().enumerate() {
                        let at = w.bases[input * gw + j];
                        *o = *src
                            .get(at)
                            .ok_or(KernelError::Internal("load outside its input"))?;
                    }
                }
                _ => apply_lanes(st, val, out)?,
            }
        }
        Ok(())
    }

    /// A full step over `g` rows of `len` lanes each, at position `p0` of the rows.
    fn full_step(&self, w: &mut Work<'_>, st: &Step, g: usize, len: usize, p0: usize) -> R {
        let lw = self.lanes;
        let gw = self.group;
        let (before, out, after, end) = step_out(w.lanes, st.out, lw, g * len, "lane buffer")?;
        if let Code::Load { input } = st.code {
            let n = self.in_len[input];
            let src = w.io.input(input, n)?;
            let step = self.in_step[input];
            let oob = || KernelError::Internal("load outside its input");
            for (j, o) in out.chunks_exact_mut(len).enumerate() {
                let start = w.bases[input * gw + j].wrapping_add(p0.wrapping_mul(step));
                match step {
                    0 => o.fill(*src.get(start).ok_or_else(oob)?),
                    1 => o.copy_from_slice(src.get(start..start + len).ok_or_else(oob)?),
                    _ => {
                        let last = (len - 1)
                            .checked_mul(step)
                            .and_then(|x| x.checked_add(start));
                        let s = last.and_then(|l| src.get(start..=l)).ok_or_else(oob)?;
                        for (o, &x) in o.iter_mut().zip(s.iter().step_by(step)) {
                            *o = x;
                        }
                    }
                }
            }
            return Ok(());
        }
        let rows = &*w.rows;
        // Operands that are the same on every lane of the chunk run it as one segment; a
        // per-row operand splits it into rows.
        let per_row = st.args.iter().any(|a| matches!(a, Src::Row(_)));
        let (before, after): (&[f32], &[f32]) = (before, after);
        let at = Around {
            rows,
            before,
            after,
            end,
            lanes: lw,
            group: gw,
        };
        let val = |s: Src, j: usize, seg: usize| at.val(s, j, j * len, seg);
        let (segs, seg) = if per_row { (g, len) } else { (1, g * len) };
        for j in 0..segs {
            let o = &mut out[j * seg..(j + 1) * seg];
            apply_lanes(st, |s| val(s, j, seg), o)?;
        }
        Ok(())
    }
}
