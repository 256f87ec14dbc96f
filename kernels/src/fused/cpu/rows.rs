//! Flat and rows-case programs ([`Program`]): a fused kernel's kept indices (its rows) outside,
//! its reduced indices inside, vectorised over the innermost axes.
//!
//! # The loop nest
//! The domain's axes of size > 1 split three ways, as in the interpreter's rows case:
//! - the **inner** axes: the innermost ones; in a reduction, exactly the trailing run of
//!   reduced axes, which every input walks with one stride (a flat kernel: the longest such
//!   run of any axes). One row's **run** is one index of the other reduced axes along them.
//! - the **run** axes: reduced axes outside the inner ones, wherever they lie among the kept
//!   ones (batch norm's batch axis over `[N, C, H, W]` reduced over `[0, 2, 3]`; any
//!   interleaving of kept and reduced axes alike). A row has one run per index of them.
//! - the **row** axes: the kept ones. Each row (index of them, row-major) is computed alone.
//!
//! A chunk holds **segments** of equal length: whole runs when a run fits in the lanes (several
//! runs of a row, several rows in a chunk), else a piece of one run. Runs of a few elements
//! ([`SHORT_RUN`]; a batch norm's 2×2 and 4×4 images, `C·H·W` apart in memory) go **across**
//! the rows instead: a group is as many rows as a chunk holds runs, a chunk is one run of each
//! of the group's rows (`[n, c0.., :, :]`, contiguous), and every run of the group's rows comes
//! before the next run. Each instruction is one loop over the chunk's lanes: across the rows,
//! a per-row operand is read from its **spread buffer** (the group's row values, each on its
//! row's lanes, filled once a stage, which every chunk of the group lines up with); otherwise
//! a per-row operand is one value where the chunk's segments are all of one row, spread over
//! the lanes first where the segments are short, and splits the loop by segment where they are
//! long. Each reduction
//! folds each segment into its row's slot, in the row's order: runs in row-major order of the
//! run axes, each through the interpreter's `acc_run` (eight interleaved partials, blocks of
//! [`RUN_BLOCK`]) and its block sums into the row's cascade (`slot_op`; a whole run of one
//! block by `fold_run`, the same arithmetic in one call). That is the order [`super::run`]
//! folds the row in, so the bits are the interpreter's, whatever rows or runs share a chunk
//! and in whichever of the two orders the chunks visit them ([`Program::item`]).
//!
//! # Threads
//! Rows are independent: [`Program::run_rows`] runs a range of them, with the same bits as
//! the whole run gives those rows. Cutting a kernel into ranges of rows therefore gives the
//! same bits on any number of threads, also where [`crate::fused::parts`] cannot cut the
//! kernel itself (a full output of a reduction whose outer axis is reduced: a range of rows is
//! no contiguous range of it, but each row's elements are written by its own range alone).

use super::arena::{in_blocks, step_out, Arena, Io, Source};
use super::body::{chunk_axes, covered, Body, Code, Pass, Src, Step};
use super::columns::offset_of;
use super::consts::{ALIGN, MAX_LANES, R, RUNS, SLOT};
use super::interpret::scratch_bytes;
use super::lane_loops::{apply_lanes, other, Val, LANE_CHOICES};
use super::reduce::{acc_run, combine8, fold8, identity, slot_op, Runs, SlotStep};
use crate::cpu::reduce::{keep_max, Cascade, LEVELS, RUN_BLOCK};
use crate::cpu::Scalar;
use crate::fused::check::KernelError;
use crate::fused::FusedKernel;
use crate::ReduceOp;
use std::ops::Range;
use zerocopy::{FromBytes, IntoBytes};

/// The most rows a group holds and segments a chunk holds (bounds the per-row slots and the
/// bases).
const MAX_ROWS: usize = 128;

/// Runs of at most this many elements, several a row, go **across** the rows: a chunk's
/// segments are one run of consecutive rows (see [`Program::item`]), not consecutive runs of
/// one row. A batch norm's `[N, C, H, W]` at 2×2 or 4×4 then reads whole stretches of `C·H·W`
/// (a row's runs are `C·H·W` apart, a few bytes each), and its rows are grouped
/// [`MAX_ROWS`] at a time.
const SHORT_RUN: usize = 32;

/// Per-row operands of segments shorter than this are spread over the chunk's lanes (each
/// segment's row value on its lanes, on the stack), so that an instruction is one loop over
/// the chunk rather than one per segment.
const SPREAD_BELOW: usize = 64;

/// A flat or rows-case fused kernel made into a program once; see the [module docs](self).
#[derive(Clone, Debug)]
pub(super) struct Program {
    body: Body,
    /// Per input: its offset, its strides over the row axes and over the run axes, and its
    /// step along the inner axes.
    in_offset: Vec<usize>,
    in_outer: Vec<Vec<usize>>,
    in_runs: Vec<Vec<usize>>,
    in_step: Vec<usize>,
    in_len: Vec<usize>,
    /// Per output: its elements ([`FusedKernel::output_len`], which allocates, asked once).
    pub(super) out_len: Vec<usize>,
    /// A full output's element strides over the row axes and over the run axes.
    out_outer: Vec<usize>,
    out_runs: Vec<usize>,
    /// Sizes of the row axes and of the run axes, outermost first.
    outer: Vec<usize>,
    run_dims: Vec<usize>,
    rows: usize,
    /// Runs per row (1 when no reduced axis lies outside the inner ones).
    runs: usize,
    /// Whether a chunk's segments go across the rows ([`SHORT_RUN`], [`Program::item`]).
    across: bool,
    /// Elements along the inner axes (a run, or a flat kernel's segment).
    n: usize,
    lanes: usize,
    /// Rows per group (their slots and row buffers are in scratch at once).
    group: usize,
    /// Segments per chunk at most (1 when a run is longer than `lanes`).
    segs: usize,
    /// Across the rows: per row buffer, its spread buffer (`usize::MAX`: none), and the
    /// spread buffers (row buffer, spread buffer) to fill after stage 0 and after each pass
    /// ([`Program::spread`]).
    spread_of: Vec<usize>,
    spread_after: Vec<Vec<(usize, usize)>>,
    pub(super) scratch: usize,
}

/// The layout of the scratch: bases, lane buffers, spread buffers, row buffers, slots (byte
/// offsets from the aligned start) and the bytes needed.
struct Carve {
    lanes_at: usize,
    spread_at: usize,
    rows_at: usize,
    slots_at: usize,
    end: usize,
}

/// Bases: per input and for the full outputs (one more), a group's rows and a chunk's segments.
/// `spread` lane-sized buffers hold row values spread over the lanes (across the rows).
fn carve(
    inputs: usize,
    (group, segs, lanes): (usize, usize, usize),
    body: &Body,
    spread: usize,
) -> Option<Carve> {
    let bases = (inputs + 1)
        .checked_mul(group.checked_add(segs)?)?
        .checked_mul(size_of::<usize>())?;
    let lanes_at = bases.checked_next_multiple_of(ALIGN)?;
    let spread_at = lanes_at.checked_add(body.lane_bufs.checked_mul(lanes)?.checked_mul(4)?)?;
    let rows_at = spread_at.checked_add(spread.checked_mul(lanes)?.checked_mul(4)?)?;
    let slots_at = rows_at
        .checked_add(body.row_bufs.checked_mul(group)?.checked_mul(4)?)?
        .checked_next_multiple_of(ALIGN)?;
    let end = slots_at.checked_add(body.slots.checked_mul(group)?.checked_mul(SLOT * 4)?)?;
    Some(Carve {
        lanes_at,
        spread_at,
        rows_at,
        slots_at,
        end,
    })
}

/// Rows per group and segments per chunk for runs of `n` elements, `runs` a row, in chunks of
/// `lanes`.
fn grouping(n: usize, runs: usize, lanes: usize) -> (usize, usize) {
    if n <= lanes {
        let per = (lanes / n.max(1)).clamp(1, MAX_ROWS);
        ((per / runs.max(1)).clamp(1, MAX_ROWS), per)
    } else {
        (1, 1)
    }
}

/// Rows per group and segments per chunk when the segments go across the rows
/// ([`SHORT_RUN`]): as many whole runs of `n` as `lanes` hold (at most [`MAX_ROWS`]), both:
/// a chunk is one run of each of the group's rows, so that the group's row values, spread
/// over the lanes once per stage, line up with every chunk's lanes; `None` when a run is
/// longer than `lanes`.
fn grouping_across(n: usize, lanes: usize) -> Option<(usize, usize)> {
    let per = (lanes / n.max(1)).clamp(1, MAX_ROWS);
    (n <= lanes).then_some((per, per))
}

/// Across the rows: which row buffers full steps read (each gets a spread buffer, in order
/// of first use), and after which stage each is filled (0: stage 0, which loads and computes
/// row values before the passes; `p + 1`: pass `p`'s folds and stage).
fn spread_plan(body: &Body) -> (Vec<usize>, Vec<Vec<(usize, usize)>>) {
    let mut spread_of = vec![usize::MAX; body.row_bufs];
    let mut n = 0;
    for st in body.passes.iter().flat_map(|p| &p.steps) {
        for a in st.args {
            if let Src::Row(b) = a {
                if let Some(s) = spread_of.get_mut(b).filter(|s| **s == usize::MAX) {
                    *s = n;
                    n += 1;
                }
            }
        }
    }
    let mut after = vec![Vec::new(); body.passes.len() + 1];
    let mut add = |stage: usize, b: usize| {
        if let Some(&s) = spread_of.get(b).filter(|&&s| s != usize::MAX) {
            after[stage].push((b, s));
        }
    };
    for st in &body.stage0 {
        add(0, st.out);
    }
    for (p, pass) in body.passes.iter().enumerate() {
        for f in &pass.folds {
            add(p + 1, f.to);
        }
        for st in &pass.stage {
            add(p + 1, st.out);
        }
    }
    (spread_of, after)
}

/// Row-major element strides of a tensor shaped like `dims`.
fn contiguous(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![0; dims.len()];
    let mut acc = 1usize;
    for (d, &n) in dims.iter().enumerate().rev() {
        s[d] = acc;
        acc = acc.saturating_mul(n);
    }
    s
}

impl Program {
    /// The program for `k`, or `None` when `k` is outside what compiled kernels cover (see the
    /// [module docs of compiled kernels](super::compiled)); then the interpreter runs it.
    pub(super) fn new(k: &FusedKernel) -> Option<Program> {
        if !covered(k) {
            return None;
        }
        let dims = &k.domain;
        let (inner, outer, run_axes, flat) = chunk_axes(k)?;
        let count = |axes: &[usize]| axes.iter().try_fold(1usize, |a, &d| a.checked_mul(dims[d]));
        let (n, rows, runs) = (count(&inner)?, count(&outer)?, count(&run_axes)?);
        let body = Body::of(k, flat)?;
        let strides = |axes: &[usize], s: &[usize]| axes.iter().map(|&a| s[a]).collect();
        let cs = contiguous(dims);

        // The most lanes whose scratch fits in what the planner reserved: across the rows
        // where the runs are short and it fits, else a row's runs together.
        let avail = scratch_bytes(k);
        let (spread_of, spread_after) = spread_plan(&body);
        let spreads = spread_of.iter().filter(|&&s| s != usize::MAX).count();
        let fit = |across: bool| {
            LANE_CHOICES.iter().find_map(|&lanes| {
                let (group, segs) = match across {
                    true => grouping_across(n, lanes)?,
                    false => grouping(n, runs, lanes),
                };
                let spread = if across { spreads } else { 0 };
                let c = carve(k.inputs.len(), (group, segs, lanes), &body, spread)?;
                let end = c.end.checked_add(ALIGN).filter(|&e| e <= avail)?;
                Some((lanes, group, segs, end, across))
            })
        };
        let short = runs > 1 && n <= SHORT_RUN;
        let (lanes, group, segs, scratch, across) =
            short.then(|| fit(true)).flatten().or_else(|| fit(false))?;
        Some(Program {
            body,
            in_offset: k.inputs.iter().map(|i| i.access.offset).collect(),
            in_outer: k
                .inputs
                .iter()
                .map(|i| strides(&outer, &i.access.strides))
                .collect(),
            in_runs: k
                .inputs
                .iter()
                .map(|i| strides(&run_axes, &i.access.strides))
                .collect(),
            in_step: k
                .inputs
                .iter()
                .map(|i| inner.last().map_or(0, |&a| i.access.strides[a]))
                .collect(),
            in_len: k.inputs.iter().map(|i| i.len).collect(),
            out_len: (0..k.outputs.len()).map(|j| k.output_len(j)).collect(),
            out_outer: strides(&outer, &cs),
            out_runs: strides(&run_axes, &cs),
            outer: outer.iter().map(|&a| dims[a]).collect(),
            run_dims: run_axes.iter().map(|&a| dims[a]).collect(),
            rows,
            runs,
            across,
            n,
            lanes,
            group: group.min(rows.max(1)),
            segs: segs.min(group.saturating_mul(runs)),
            spread_of: if across { spread_of } else { Vec::new() },
            spread_after: if across { spread_after } else { Vec::new() },
            scratch,
        })
    }

    /// Lanes per chunk, and rows per group (for reports and tests).
    pub(super) fn shape(&self) -> (usize, usize) {
        (self.lanes, self.group)
    }

    /// What the program computes.
    pub(super) fn body(&self) -> &Body {
        &self.body
    }

    /// The rows (indices of the kept axes) that [`Program::run_rows`] can run apart.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// Runs rows `range` of the program on the arena that
    /// [`Compiled::run`](super::Compiled::run) checked and split, a group of rows at a time.
    pub(super) fn run_rows(&self, a: Arena<'_>, range: Range<usize>) -> R {
        if range.start > range.end || range.end > self.rows {
            return Err(KernelError::Internal("rows outside the kernel"));
        }
        let mut w = self.work(a)?;
        in_blocks(range.end - range.start, self.group, |r, g| {
            self.group_run(&mut w, range.start + r, g)
        })
    }

    /// The scratch of the arena, carved into this program's parts.
    fn work<'m>(&self, a: Arena<'m>) -> R<Work<'m>> {
        let ni = self.in_len.len();
        let spreads = self.spread_of.iter().filter(|&&s| s != usize::MAX).count();
        let c = carve(ni, (self.group, self.segs, self.lanes), &self.body, spreads)
            .ok_or(KernelError::Internal("compiled scratch"))?;
        let sc = super::lanes::sub_mut(a.scratch, 0, c.end)?;
        let (b_bases, rest) = sc.split_at_mut(c.lanes_at);
        let (b_lanes, rest) = rest.split_at_mut(c.spread_at - c.lanes_at);
        let (b_spread, rest) = rest.split_at_mut(c.rows_at - c.spread_at);
        let (b_rows, b_slots) = rest.split_at_mut(c.slots_at - c.rows_at);
        let bad = || KernelError::Internal("compiled scratch misaligned");
        let n_rows = (ni + 1) * self.group;
        let n_segs = (ni + 1) * self.segs;
        let bases =
            <[usize]>::mut_from_bytes(&mut b_bases[..(n_rows + n_segs) * size_of::<usize>()])
                .map_err(|_| bad())?;
        let (row_bases, seg_bases) = bases.split_at_mut(n_rows);
        let lanes = <[f32]>::mut_from_bytes(b_lanes).map_err(|_| bad())?;
        let spread = <[f32]>::mut_from_bytes(b_spread).map_err(|_| bad())?;
        let rows_b = &mut b_rows[..self.body.row_bufs * self.group * 4];
        let rows = <[f32]>::mut_from_bytes(rows_b).map_err(|_| bad())?;
        let slots = <[f32]>::mut_from_bytes(b_slots).map_err(|_| bad())?;
        Ok(Work {
            io: a.io,
            row_bases,
            seg_bases,
            lanes,
            spread,
            rows,
            slots,
        })
    }

    /// Rows `r0 .. r0 + g`: their bases, stages, passes and stores.
    fn group_run(&self, w: &mut Work<'_>, r0: usize, g: usize) -> R {
        // Each input's element index (and the full outputs') at the start of each row: one
        // step of the innermost row axis from the row before, but where that axis wraps.
        let ni = self.in_len.len();
        let d_last = self.outer.last().copied().unwrap_or(1).max(1);
        for q in 0..=ni {
            let (start, strides) = match q < ni {
                true => (self.in_offset[q], &self.in_outer[q]),
                false => (0, &self.out_outer),
            };
            let s_last = strides.last().copied().unwrap_or(0);
            let at_row = |r: usize| start.wrapping_add(offset_of(r, &self.outer, strides));
            let (mut at, mut c) = (at_row(r0), r0 % d_last);
            let bases = super::lanes::sub_mut(w.row_bases, q * self.group, g)?;
            for (j, b) in bases.iter_mut().enumerate() {
                if j > 0 {
                    c += 1;
                    if c == d_last {
                        c = 0;
                        at = at_row(r0 + j);
                    } else {
                        at = at.wrapping_add(s_last);
                    }
                }
                *b = at;
            }
        }
        self.stage(w, &self.body.stage0, g)?;
        self.spread(w, 0, g)?;
        let n_passes = self.body.passes.len();
        let items = g * self.runs;
        for (p, pass) in self.body.passes.iter().enumerate() {
            let last = p + 1 == n_passes;
            for f in &pass.folds {
                for j in 0..g {
                    let s = self.slot_mut(w, f.slot, j)?;
                    slot_op::<f32>(f.op, s.as_mut_bytes(), SlotStep::StartRow, self.runs_of(0))?;
                }
            }
            if self.n <= self.lanes {
                // Across the rows, a chunk is one run of each of the group's rows (their row
                // values spread over its lanes line up with it).
                let per = if self.across { g } else { self.segs };
                in_blocks(items, per, |q0, cnt| {
                    self.chunk(w, pass, last, (q0, cnt, g), 0, self.n)
                })?;
            } else {
                for q in 0..items {
                    in_blocks(self.n, self.lanes, |p0, len| {
                        self.chunk(w, pass, last, (q, 1, g), p0, len)
                    })?;
                }
            }
            for f in &pass.folds {
                for j in 0..g {
                    let runs = self.runs_of(self.runs - 1);
                    let s = self.slot_mut(w, f.slot, j)?;
                    slot_op::<f32>(f.op, s.as_mut_bytes(), SlotStep::EndRow, runs)?;
                    let v = s[RUNS];
                    *w.rows
                        .get_mut(f.to * self.group + j)
                        .ok_or(KernelError::Internal("row buffer"))? = v;
                }
            }
            self.stage(w, &pass.stage, g)?;
            self.spread(w, p + 1, g)?;
        }
        let b = &self.body;
        w.io.store_rows(
            &b.outputs,
            &b.out_bool,
            w.rows,
            self.group,
            self.rows,
            r0,
            g,
        )
    }

    /// Segment `q` of a group of `g` rows: its row in the group and its run in the row. A
    /// row's runs come in order either way: run `q % runs` of row `q / runs` (a row's runs
    /// together), or, across the rows ([`SHORT_RUN`]), run `q / g` of row `q % g` (each run
    /// of every row of the group before the next run).
    #[inline]
    fn item(&self, q: usize, g: usize) -> (usize, usize) {
        if self.runs == 1 {
            // A run a row (every flat kernel): segment `q` is row `q`, no division.
            return (q, 0);
        }
        match self.across {
            true => (q % g.max(1), q / g.max(1)),
            false => (q / self.runs, q % self.runs),
        }
    }

    /// One chunk of a pass: segments `q0 .. q0 + cnt` of a group of `g` rows (`(q0, cnt,
    /// g)`; segment `q` is run `r` of the group's row `j`, `(j, r) =`
    /// [`Program::item`]`(q, g)`), each `len` elements from position `p0` of its run: their
    /// bases, the pass's steps, folds and (in the last pass) full stores.
    fn chunk(
        &self,
        w: &mut Work<'_>,
        pass: &Pass,
        last: bool,
        (q0, cnt, g): (usize, usize, usize),
        p0: usize,
        len: usize,
    ) -> R {
        let ni = self.in_len.len();
        if self.across {
            // One run `r` of rows `0 .. cnt` of the group: one offset of the run a buffer.
            let r = q0 / g.max(1);
            for q in 0..=ni {
                let strides = if q < ni {
                    &self.in_runs[q]
                } else {
                    &self.out_runs
                };
                let run = offset_of(r, &self.run_dims, strides);
                let rows = super::lanes::sub(w.row_bases, q * self.group, cnt)?;
                let segs = super::lanes::sub_mut(w.seg_bases, q * self.segs, cnt)?;
                for (s, &b) in segs.iter_mut().zip(rows) {
                    *s = b.wrapping_add(run);
                }
            }
        }
        for s in (0..cnt).filter(|_| !self.across) {
            let (j, r) = self.item(q0 + s, g);
            for q in 0..=ni {
                let strides = if q < ni {
                    &self.in_runs[q]
                } else {
                    &self.out_runs
                };
                let run = offset_of(r, &self.run_dims, strides);
                w.seg_bases[q * self.segs + s] = w.row_bases[q * self.group + j].wrapping_add(run);
            }
        }
        for st in &pass.steps {
            self.full_step(w, st, (q0, cnt, g), len, p0)?;
        }
        let blocks = self.n.div_ceil(RUN_BLOCK);
        // Whole runs of one block: folded at once (the same arithmetic as the steps below).
        let whole = p0 == 0 && len == self.n && self.n <= RUN_BLOCK;
        // Across the rows the chunk is run `q0 / g` of rows `0 .. cnt`: no division a segment.
        let r_across = q0 / g.max(1);
        for f in &pass.folds {
            for s in 0..cnt {
                let (j, r) = match self.across {
                    true => (s, r_across),
                    false => self.item(q0 + s, g),
                };
                let xs = super::lanes::sub(w.lanes, f.from * self.lanes + s * len, len)?;
                let at = (f.slot * self.group + j) * SLOT;
                let slot = super::lanes::sub_mut(w.slots, at, SLOT)?;
                if whole {
                    fold_run(f.op, xs, slot, r, self.runs > 1);
                    continue;
                }
                if p0 == 0 {
                    slot_op::<f32>(
                        f.op,
                        slot.as_mut_bytes(),
                        SlotStep::StartRun,
                        self.runs_of(r),
                    )?;
                }
                acc_run::<f32>(f.op, xs.as_bytes(), slot.as_mut_bytes(), p0, r * blocks)?;
                if p0 + len == self.n {
                    slot_op::<f32>(f.op, slot.as_mut_bytes(), SlotStep::EndRun, self.runs_of(r))?;
                }
            }
        }
        if last {
            self.store_full(w, cnt, len, p0)?;
        }
        Ok(())
    }

    /// Stores the chunk's `cnt` segments of `len` elements (from position `p0` of their runs)
    /// of every full output: one copy where they are consecutive in the output.
    fn store_full(&self, w: &mut Work<'_>, cnt: usize, len: usize, p0: usize) -> R {
        let ob = &w.seg_bases[self.in_len.len() * self.segs..][..cnt];
        let total = self.rows * self.runs * self.n;
        for (o, &(src, per_row)) in self.body.outputs.iter().enumerate() {
            if per_row {
                continue;
            }
            let mut dst = w.io.dest(o, total, self.body.out_bool[o])?;
            // One copy per stretch of segments consecutive in the output.
            for (s0, k) in spans(ob, len) {
                let (at, seg) = (ob[s0].wrapping_add(p0), k * len);
                match src {
                    Src::Lanes(b) => dst.put(
                        at,
                        super::lanes::sub(w.lanes, b * self.lanes + s0 * len, seg)?,
                    )?,
                    Src::Const(c) => dst.fill(at, seg, c)?,
                    Src::Row(_) => return Err(KernelError::Internal("row value stored full")),
                }
            }
        }
        Ok(())
    }

    /// The rows case's run bookkeeping, for run `index` of a row.
    fn runs_of(&self, index: usize) -> Runs {
        Runs {
            multi: self.runs > 1,
            index,
            count: self.runs,
            len: self.n,
        }
    }

    fn slot_mut<'w>(&self, w: &'w mut Work<'_>, slot: usize, j: usize) -> R<&'w mut [f32]> {
        super::lanes::sub_mut(w.slots, (slot * self.group + j) * SLOT, SLOT)
    }

    /// Across the rows: the row buffers that stage `at` (0: stage 0; `p + 1`: pass `p`'s folds
    /// and stage) made and full steps read, spread over the lanes of the group's `g` rows
    /// (row `j`'s value on lanes `j·n .. (j + 1)·n`), once a group rather than once a chunk.
    fn spread(&self, w: &mut Work<'_>, at: usize, g: usize) -> R {
        let Some(list) = self.spread_after.get(at) else {
            return Ok(());
        };
        for &(b, sp) in list {
            let vals = super::lanes::sub(w.rows, b * self.group, g)?;
            let lanes = super::lanes::sub_mut(w.spread, sp * self.lanes, g * self.n)?;
            for (o, &v) in lanes.chunks_exact_mut(self.n.max(1)).zip(vals) {
                o.fill(v);
            }
        }
        Ok(())
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
                    let src = w.io.source(input, len, self.body.in_bool[input])?;
                    for (j, o) in out.iter_mut().enumerate() {
                        let at = w.row_bases[input * gw + j];
                        *o = src
                            .get(at)
                            .ok_or(KernelError::Internal("load outside its input"))?;
                    }
                }
                _ => apply_lanes(st, val, out)?,
            }
        }
        Ok(())
    }

    /// A full step over the chunk's `cnt` segments (from `q0`, of a group of `g` rows) of
    /// `len` lanes each, at position `p0` of their runs.
    fn full_step(
        &self,
        w: &mut Work<'_>,
        st: &Step,
        (q0, cnt, g): (usize, usize, usize),
        len: usize,
        p0: usize,
    ) -> R {
        let lw = self.lanes;
        let (before, out, after, end) = step_out(w.lanes, st.out, lw, cnt * len, "lane buffer")?;
        if let Code::Load { input } = st.code {
            let src =
                w.io.source(input, self.in_len[input], self.body.in_bool[input])?;
            let bases = &w.seg_bases[input * self.segs..][..cnt];
            let step = self.in_step[input];
            return match src {
                Source::F32(s) => load(s, out, bases, step, p0, len, |x| x),
                Source::Bool(s) => load(s, out, bases, step, p0, len, |b| f32::from(b != 0)),
            };
        }
        let rows = &*w.rows;
        // Operands that are the same on every lane of the chunk run it as one segment; a
        // per-row operand splits it into segments, unless the chunk's segments are all of
        // one row.
        let per_row = st.args.iter().any(|a| matches!(a, Src::Row(_)));
        let (before, after): (&[f32], &[f32]) = (before, after);
        let at = Around {
            rows,
            before,
            after,
            end,
            lanes: lw,
            group: self.group,
        };
        if per_row && self.across {
            // The chunk is one run of rows `0 .. cnt` of the group: a per-row operand is its
            // spread buffer's first `cnt · len` lanes ([`Program::spread`]).
            let spread = &*w.spread;
            return apply_lanes(
                st,
                |v| match v {
                    Src::Row(b) => {
                        let sp = self.spread_of.get(b).copied().unwrap_or(usize::MAX);
                        let lanes = sp
                            .checked_mul(lw)
                            .ok_or(KernelError::Internal("a row value not spread"))?;
                        Ok(Val::Lanes(super::lanes::sub(spread, lanes, cnt * len)?))
                    }
                    _ => at.val(v, 0, 0, cnt * len),
                },
                out,
            );
        }
        let one_row = cnt <= 1 || self.item(q0, g).0 == self.item(q0 + cnt - 1, g).0;
        if per_row && !one_row && len < SPREAD_BELOW {
            // Each per-row operand spread over the chunk's lanes: one loop over the chunk,
            // each lane computing what its segment's own loop would (the same scalar
            // function on the same two values).
            let mut spread = [[0f32; MAX_LANES]; 3];
            let mut held = [usize::MAX; 3];
            for (a, (buf, h)) in st.args.iter().zip(spread.iter_mut().zip(&mut held)) {
                if let Src::Row(b) = *a {
                    let buf = buf
                        .get_mut(..cnt * len)
                        .ok_or(KernelError::Internal("spread lanes"))?;
                    for (s, lanes) in buf.chunks_exact_mut(len).enumerate() {
                        let (j, _) = self.item(q0 + s, g);
                        lanes.fill(at.row(b, j)?);
                    }
                    *h = b;
                }
            }
            let spread = &spread;
            return apply_lanes(
                st,
                |v| match v {
                    Src::Row(b) => {
                        let i = held.iter().position(|&h| h == b);
                        let i = i.ok_or(KernelError::Internal("spread operand"))?;
                        Ok(Val::Lanes(&spread[i][..cnt * len]))
                    }
                    _ => at.val(v, 0, 0, cnt * len),
                },
                out,
            );
        }
        let (pieces, seg) = if per_row && !one_row {
            (cnt, len)
        } else {
            (1, cnt * len)
        };
        for s in 0..pieces {
            let (j, _) = self.item(q0 + s, g);
            let o = &mut out[s * seg..(s + 1) * seg];
            apply_lanes(st, |v| at.val(v, j, s * seg, seg), o)?;
        }
        Ok(())
    }
}

/// Copies `len` elements of each segment (elements `base + (p0 + i)·step` of `src`, one
/// segment per base, each as `f` makes it an f32) into `out`: one copy where the segments are
/// consecutive in `src`, else a copy, a fill or a gather per segment.
#[inline(always)]
fn load<T: Copy>(
    src: &[T],
    out: &mut [f32],
    bases: &[usize],
    step: usize,
    p0: usize,
    len: usize,
    f: impl Fn(T) -> f32,
) -> R {
    let oob = || KernelError::Internal("load outside its input");
    let start = |b: usize| b.wrapping_add(p0.wrapping_mul(step));
    let copy = |o: &mut [f32], s: &[T]| {
        for (o, &x) in o.iter_mut().zip(s) {
            *o = f(x);
        }
    };
    if step == 1 {
        // One copy per stretch of segments consecutive in `src`.
        for (s0, k) in spans(bases, len) {
            let o = out.get_mut(s0 * len..(s0 + k) * len).ok_or_else(oob)?;
            let at = start(bases[s0]);
            let s = at.checked_add(o.len()).and_then(|e| src.get(at..e));
            copy(o, s.ok_or_else(oob)?);
        }
        return Ok(());
    }
    for (o, &b) in out.chunks_exact_mut(len).zip(bases) {
        let s0 = start(b);
        match step {
            0 => o.fill(f(*src.get(s0).ok_or_else(oob)?)),
            1 => copy(o, src.get(s0..s0.wrapping_add(len)).ok_or_else(oob)?),
            _ => {
                let last = (len - 1).checked_mul(step).and_then(|x| x.checked_add(s0));
                let s = last.and_then(|l| src.get(s0..=l)).ok_or_else(oob)?;
                for (o, &x) in o.iter_mut().zip(s.iter().step_by(step)) {
                    *o = f(x);
                }
            }
        }
    }
    Ok(())
}

/// The stretches of `bases` (segments of `len` elements) that lie one after another:
/// `(first segment, segments)` for each, in order.
fn spans(bases: &[usize], len: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut s0 = 0;
    std::iter::from_fn(move || {
        if s0 >= bases.len() {
            return None;
        }
        let mut k = 1;
        while s0 + k < bases.len() && bases[s0 + k] == bases[s0 + k - 1].wrapping_add(len) {
            k += 1;
        }
        let span = (s0, k);
        s0 += k;
        Some(span)
    })
}

/// Folds a whole run of one block, run `run` of its row, into the row's slot: what
/// `StartRun`, `acc_run` and `EndRun` ([`slot_op`], [`acc_run`]) do to it, term for term (the
/// eight partials from the identity, combined, then the block's sum into the row's cascade as
/// value `run`, or a max into the row's fold), without their per-call bookkeeping, which
/// dominated runs of a few elements (a batch norm's 2×2 images).
#[inline]
fn fold_run(op: ReduceOp, xs: &[f32], slot: &mut [f32], run: usize, multi: bool) {
    let mut p = [identity::<f32>(op); 8];
    match op {
        ReduceOp::Sum => {
            fold8(xs, &mut p, <f32 as Scalar>::add);
            let b = combine8(&p, <f32 as Scalar>::add);
            Cascade::push(&mut slot[RUNS..RUNS + LEVELS], run, b);
        }
        ReduceOp::Max => {
            fold8(xs, &mut p, keep_max);
            let v = combine8(&p, keep_max);
            slot[RUNS] = if multi { keep_max(slot[RUNS], v) } else { v };
        }
    }
}

/// What a run works on: the arena outside the scratch, and the scratch's parts.
struct Work<'m> {
    io: Io<'m>,
    /// Per input (and last, the full outputs): the element index of each row of the group
    /// (`q * group + j`), and of each segment of the chunk (`q * segs + s`).
    row_bases: &'m mut [usize],
    seg_bases: &'m mut [usize],
    lanes: &'m mut [f32],
    /// Across the rows: row values read by full steps, each spread over the lanes (row `j`'s
    /// value on lanes `j·n .. (j + 1)·n`), one buffer of `lanes` per spread row buffer.
    spread: &'m mut [f32],
    rows: &'m mut [f32],
    slots: &'m mut [f32],
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
        Src::Row(b) => Val::Lanes(super::lanes::sub(other(before, after, end, gw, b)?, 0, g)?),
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
    /// Row buffer `b`'s value for row `j` of the group.
    fn row(&self, b: usize, j: usize) -> R<f32> {
        self.rows
            .get(b * self.group + j)
            .copied()
            .ok_or(KernelError::Internal("row buffer"))
    }

    /// Operand `s` for row `j` of the group, over `seg` lanes from lane `from`.
    fn val(&self, s: Src, j: usize, from: usize, seg: usize) -> R<Val<'a>> {
        Ok(match s {
            Src::Const(c) => Val::One(c),
            Src::Row(b) => Val::One(self.row(b, j)?),
            Src::Lanes(b) => Val::Lanes(super::lanes::sub(
                other(self.before, self.after, self.end, self.lanes, b)?,
                from,
                seg,
            )?),
        })
    }
}
