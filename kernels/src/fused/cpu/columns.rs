//! Column reductions made into programs when a step is loaded: the interpreter's columns case
//! (a bias gradient summed over the batch, a layer norm's weight gradient summed over its rows)
//! as loops over several terms at once.
//!
//! # Why
//! The interpreter's columns case puts the kept columns in its lanes and walks the reduced
//! indices (each column's terms) one at a time: every term costs the dispatch of the whole
//! body over as many lanes as there are columns (64 on the README's main job, whose 14 column
//! kernels were 7% of its step on one thread). A [`Columns`] program puts **several terms in
//! one chunk** (`terms × columns` lanes, up to [`MAX_LANES`](super::compiled::MAX_LANES)):
//! each instruction is one loop over the whole chunk, and each reduction then adds the chunk's
//! terms into its per-column accumulators one term after another, a vector add each.
//!
//! # Which kernels
//! What compiled programs cover ([`super::compiled`]: f32 values, loads, constants, unary,
//! binary, compare, select, sum and max), in the columns case (the innermost axis of size > 1
//! kept); the **columns** are the longest trailing run of kept axes every input walks with
//! one stride:
//! `[rows, columns]` summed over rows; `[batch, seq, d]` summed over batch and seq; and any
//! interleaving of kept and reduced axes outside the columns (`[A, B, C]` summed over `B`):
//! the kept axes outside the columns make **planes**, each computed alone, and a column's
//! terms are the indices of all the reduced axes, row-major, wherever they lie. Other kernels
//! stay with the interpreter.
//!
//! # The same bits
//! Every value is computed by the scalar functions the interpreter calls, and every column's
//! terms go, in the interpreter's order (row-major over the reduced axes), through the
//! interpreter's own `acc_lanes` (the cascade of [`FAN`] values a level) and
//! `finish_cascade_lanes`, whatever the number of terms a chunk or of columns a block. A kernel
//! cut into ranges of columns ([`crate::fused::parts`]) therefore gives the same bits on any
//! number of threads: each column is computed as it is alone.

use super::arena::{in_blocks, step_out, Arena, Io, Source};
use super::body::{covered, Body, Code, Src, Step};
use super::consts::{ALIGN, R};
use super::interpret::scratch_bytes;
use super::lane_loops::{apply_lanes, other, Val, LANE_CHOICES};
use super::reduce::{acc_lanes, finish_cascade_lanes, identity};
use crate::cpu::reduce::{FAN, LEVELS};
use crate::fused::check::KernelError;
use crate::fused::FusedKernel;
use crate::ReduceOp;
use std::ops::Range;
use zerocopy::{FromBytes, IntoBytes};

/// A column-reduction kernel made into a program once; see the [module docs](self).
#[derive(Clone, Debug)]
pub(super) struct Columns {
    body: Body,
    /// Per input: its offset, its strides over the reduced axes and over the planes' axes,
    /// its step along the terms where the reduced axes compose into one (else `None`), and its
    /// stride along the columns.
    in_offset: Vec<usize>,
    in_terms: Vec<Vec<usize>>,
    in_planes: Vec<Vec<usize>>,
    in_term: Vec<Option<usize>>,
    in_col: Vec<usize>,
    in_len: Vec<usize>,
    /// Per output: its elements.
    out_len: Vec<usize>,
    /// A full output's element strides over the reduced axes and over the planes' axes.
    out_terms: Vec<usize>,
    out_planes: Vec<usize>,
    /// Sizes of the reduced axes and of the planes' axes (the kept ones outside the columns).
    term_dims: Vec<usize>,
    plane_dims: Vec<usize>,
    /// Terms of every column's reductions (the reduced indices), columns (the trailing kept
    /// indices) and planes (the other kept indices).
    terms: usize,
    cols: usize,
    planes: usize,
    lanes: usize,
    /// Columns a block: all of them when they fit in a chunk, else a chunk's worth.
    width: usize,
    /// Whether the sums need cascade levels above their accumulator (more than [`FAN`] terms).
    upper: bool,
    scratch: usize,
}

/// Where the parts of the scratch start, in f32 elements from its aligned start: lane
/// buffers, row buffers (one value a column of the block), cascade levels; and the end.
struct Carve {
    rows_at: usize,
    upper_at: usize,
    end: usize,
}

fn carve(body: &Body, lanes: usize, width: usize, upper: bool) -> Option<Carve> {
    let rows_at = body.lane_bufs.checked_mul(lanes)?;
    let upper_at = rows_at.checked_add(body.row_bufs.checked_mul(width)?)?;
    let levels = if upper {
        body.slots.checked_mul((LEVELS - 1) * width)?
    } else {
        0
    };
    Some(Carve {
        rows_at,
        upper_at,
        end: upper_at.checked_add(levels)?,
    })
}

/// The scratch of a run, as f32: lane buffers, row buffers, cascade levels.
struct Work<'m> {
    io: Io<'m>,
    lanes: &'m mut [f32],
    rows: &'m mut [f32],
    upper: &'m mut [f32],
}

impl Columns {
    /// The program for `k`, or `None` when `k` is not a column reduction this module covers.
    pub(super) fn new(k: &FusedKernel) -> Option<Columns> {
        if !covered(k) {
            return None;
        }
        let dims = &k.domain;
        let red = |d: usize| k.reduce_axes.contains(&d);
        let eff: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] != 1).collect();
        let composes = |s: &[usize], axes: &[usize]| {
            axes.windows(2)
                .all(|w| s[w[1]].checked_mul(dims[w[1]]) == Some(s[w[0]]))
        };
        // The columns: the longest trailing run of kept axes that every input walks with one
        // stride (a column is computed alone, so where the run ends changes no bit).
        let trailing = eff.iter().rev().take_while(|&&d| !red(d)).count();
        let mut t = trailing.min(1);
        while t < trailing
            && k.inputs
                .iter()
                .all(|i| composes(&i.access.strides, &eff[eff.len() - t - 1..]))
        {
            t += 1;
        }
        let (outside, kept) = eff.split_at(eff.len() - t);
        let reduced: Vec<usize> = outside.iter().copied().filter(|&d| red(d)).collect();
        let planes_axes: Vec<usize> = outside.iter().copied().filter(|&d| !red(d)).collect();
        if reduced.is_empty() || kept.is_empty() {
            return None;
        }
        let count = |axes: &[usize]| axes.iter().try_fold(1usize, |a, &d| a.checked_mul(dims[d]));
        let (terms, cols, planes) = (count(&reduced)?, count(kept)?, count(&planes_axes)?);
        let body = Body::of(k, false)?;
        let upper = terms > FAN;
        let avail = scratch_bytes(k);
        let mut pick = None;
        for &lanes in &LANE_CHOICES {
            let width = cols.min(lanes);
            let Some(c) = carve(&body, lanes, width, upper) else {
                continue;
            };
            let bytes = c.end.checked_mul(4)?.checked_add(ALIGN)?;
            if bytes <= avail {
                pick = Some((lanes, width, bytes));
                break;
            }
        }
        let (lanes, width, scratch) = pick?;
        let last = |axes: &[usize], s: &[usize]| axes.last().map_or(0, |&a| s[a]);
        let strides = |axes: &[usize], s: &[usize]| axes.iter().map(|&a| s[a]).collect();
        let cs = crate::fused::Access::contiguous(dims).strides;
        Some(Columns {
            in_offset: k.inputs.iter().map(|i| i.access.offset).collect(),
            in_terms: k
                .inputs
                .iter()
                .map(|i| strides(&reduced, &i.access.strides))
                .collect(),
            in_planes: k
                .inputs
                .iter()
                .map(|i| strides(&planes_axes, &i.access.strides))
                .collect(),
            in_term: k
                .inputs
                .iter()
                .map(|i| {
                    let s = &i.access.strides;
                    composes(s, &reduced).then(|| last(&reduced, s))
                })
                .collect(),
            out_terms: strides(&reduced, &cs),
            out_planes: strides(&planes_axes, &cs),
            term_dims: reduced.iter().map(|&a| dims[a]).collect(),
            plane_dims: planes_axes.iter().map(|&a| dims[a]).collect(),
            planes,
            in_col: k
                .inputs
                .iter()
                .map(|i| last(kept, &i.access.strides))
                .collect(),
            in_len: k.inputs.iter().map(|i| i.len).collect(),
            out_len: (0..k.outputs.len()).map(|j| k.output_len(j)).collect(),
            body,
            terms,
            cols,
            lanes,
            width,
            upper,
            scratch,
        })
    }

    /// Bytes of scratch the program uses: never more than [`super::scratch_bytes`] of its
    /// kernel.
    pub(super) fn scratch_bytes(&self) -> usize {
        self.scratch
    }

    /// Lanes per chunk, and terms per chunk when a block holds every column.
    pub(super) fn shape(&self) -> (usize, usize) {
        (self.lanes, (self.lanes / self.width).max(1))
    }

    /// The elements of each output.
    pub(super) fn out_len(&self) -> &[usize] {
        &self.out_len
    }

    /// What the program computes.
    pub(super) fn body(&self) -> &Body {
        &self.body
    }

    /// The columns of every plane (planes × columns), which [`Columns::run_cols`] can run
    /// apart.
    pub(super) fn cols(&self) -> usize {
        self.planes * self.cols
    }

    /// Runs columns `range` of the program on the arena that
    /// [`Compiled::run_rows`](super::Compiled::run_rows) checked and split, a block of columns
    /// at a time (each column's terms fold alone, whatever block it is in).
    pub(super) fn run_cols(&self, a: Arena<'_>, range: Range<usize>) -> R {
        if range.start > range.end || range.end > self.cols() {
            return Err(KernelError::Internal("columns outside the kernel"));
        }
        let mut w = self.work(a)?;
        let mut at = range.start;
        while at < range.end {
            let (plane, c) = (at / self.cols, at % self.cols);
            let upto = (range.end - plane * self.cols).min(self.cols);
            in_blocks(upto - c, self.width, |c0, n| {
                self.block(&mut w, plane, c + c0, n)
            })?;
            at = plane * self.cols + upto;
        }
        Ok(())
    }

    /// The scratch of the arena, carved into this program's parts.
    fn work<'m>(&self, a: Arena<'m>) -> R<Work<'m>> {
        let c = carve(&self.body, self.lanes, self.width, self.upper)
            .ok_or(KernelError::Internal("columns scratch"))?;
        let sc = super::lanes::sub_mut(a.scratch, 0, c.end * 4)?;
        let sc = <[f32]>::mut_from_bytes(sc)
            .map_err(|_| KernelError::Internal("columns scratch misaligned"))?;
        let (lanes, rest) = sc.split_at_mut(c.rows_at);
        let (rows, upper) = rest.split_at_mut(c.upper_at - c.rows_at);
        Ok(Work {
            io: a.io,
            lanes,
            rows,
            upper,
        })
    }

    /// Columns `c0 .. c0 + n` of plane `plane`: their stages, passes over every term, and
    /// stores.
    fn block(&self, w: &mut Work<'_>, plane: usize, c0: usize, n: usize) -> R {
        let per_chunk = (self.lanes / n).max(1);
        let at = Place {
            plane,
            c0,
            n,
            total: self.planes * self.cols,
        };
        self.stage(w, &self.body.stage0, &at)?;
        let n_passes = self.body.passes.len();
        for (p, pass) in self.body.passes.iter().enumerate() {
            let last = p + 1 == n_passes;
            for f in &pass.folds {
                super::lanes::sub_mut(w.rows, f.to * self.width, n)?.fill(identity::<f32>(f.op));
                self.levels(w.upper, f.slot, n)?.fill(0.0);
            }
            let mut t0 = 0;
            while t0 < self.terms {
                let g = per_chunk.min(self.terms - t0);
                for st in &pass.steps {
                    self.full_step(w, st, &at, t0, g)?;
                }
                for f in &pass.folds {
                    let acc = super::lanes::sub_mut(w.rows, f.to * self.width, n)?;
                    let upper = self.levels(w.upper, f.slot, n)?;
                    for j in 0..g {
                        let xs = super::lanes::sub(w.lanes, f.from * self.lanes + j * n, n)?;
                        acc_lanes::<f32>(
                            f.op,
                            xs.as_bytes(),
                            acc.as_mut_bytes(),
                            upper.as_mut_bytes(),
                            t0 + j,
                        )?;
                    }
                }
                if last {
                    self.store_full(w, &at, t0, g)?;
                }
                t0 += g;
            }
            for f in &pass.folds {
                if f.op == ReduceOp::Sum {
                    let acc = super::lanes::sub_mut(w.rows, f.to * self.width, n)?;
                    let upper = self.levels(w.upper, f.slot, n)?;
                    finish_cascade_lanes::<f32>(
                        acc.as_mut_bytes(),
                        upper.as_mut_bytes(),
                        self.terms,
                    )?;
                }
            }
            self.stage(w, &pass.stage, &at)?;
        }
        let start = plane * self.cols + c0;
        let b = &self.body;
        w.io.store_rows(
            &b.outputs,
            &b.out_bool,
            w.rows,
            self.width,
            at.total,
            start,
            n,
        )
    }

    /// Input `q`'s element index at term 0 of column 0 of `plane`.
    fn plane_base(&self, q: usize, plane: usize) -> usize {
        let off = offset_of(plane, &self.plane_dims, &self.in_planes[q]);
        self.in_offset[q].wrapping_add(off)
    }

    /// The cascade levels above reduction slot `slot`'s accumulator, for `n` columns (empty
    /// when no sum has more than [`FAN`] terms).
    fn levels<'u>(&self, upper: &'u mut [f32], slot: usize, n: usize) -> R<&'u mut [f32]> {
        if !self.upper {
            return Ok(&mut []);
        }
        let per = (LEVELS - 1) * self.width;
        super::lanes::sub_mut(upper, slot * per, (LEVELS - 1) * n)
    }

    /// Stores the chunk's terms `t0 .. t0 + g` of every full output, columns `c0 .. c0 + n`
    /// of the plane: one copy where the chunk is consecutive in the output.
    fn store_full(&self, w: &mut Work<'_>, at: &Place, t0: usize, g: usize) -> R {
        let (c0, n) = (at.c0, at.n);
        let plane = offset_of(at.plane, &self.plane_dims, &self.out_planes);
        let term = |t: usize| offset_of(t, &self.term_dims, &self.out_terms);
        // Terms one after another in the output (the reduced axes compose and the columns
        // follow them), all columns stored: the chunk is one run of the output.
        let whole = n == self.cols
            && self.out_terms.last().is_none_or(|&s| s == self.cols)
            && (t0..t0 + g).all(|t| term(t) == term(t0) + (t - t0) * self.cols);
        for (o, &(src, per_col)) in self.body.outputs.iter().enumerate() {
            if per_col {
                continue;
            }
            let mut dst = w.io.dest(o, self.out_len[o], self.body.out_bool[o])?;
            let rows = if whole { 1 } else { g };
            let len = if whole { g * n } else { n };
            for j in 0..rows {
                let d = plane + term(t0 + j) + c0;
                match src {
                    Src::Lanes(b) => {
                        dst.put(d, super::lanes::sub(w.lanes, b * self.lanes + j * n, len)?)?
                    }
                    Src::Const(c) => dst.fill(d, len, c)?,
                    Src::Row(_) => return Err(KernelError::Internal("column value stored full")),
                }
            }
        }
        Ok(())
    }

    /// Column-level steps over the block's columns (operands: row buffers, constants).
    fn stage(&self, w: &mut Work<'_>, steps: &[Step], at: &Place) -> R {
        let (c0, n) = (at.c0, at.n);
        let width = self.width;
        for st in steps {
            let (before, out, after, end) = step_out(w.rows, st.out, width, n, "row buffer")?;
            let val = |s: Src| {
                Ok(match s {
                    Src::Const(c) => Val::One(c),
                    Src::Row(b) => Val::Lanes(super::lanes::sub(
                        other(before, after, end, width, b)?,
                        0,
                        n,
                    )?),
                    Src::Lanes(_) => return Err(KernelError::Internal("lane value in a stage")),
                })
            };
            match st.code {
                Code::Load { input } => {
                    let src =
                        w.io.source(input, self.in_len[input], self.body.in_bool[input])?;
                    let step = self.in_col[input];
                    let base = self.plane_base(input, at.plane);
                    for (c, o) in out.iter_mut().enumerate() {
                        let at = (c0 + c).checked_mul(step).and_then(|x| x.checked_add(base));
                        *o = at
                            .and_then(|a| src.get(a))
                            .ok_or(KernelError::Internal("load outside its input"))?;
                    }
                }
                _ => apply_lanes(st, val, out)?,
            }
        }
        Ok(())
    }

    /// A full step over terms `t0 .. t0 + g` of the block's columns `c0 .. c0 + n`: lane
    /// `j·n + c` is term `t0 + j` of column `c0 + c`.
    fn full_step(&self, w: &mut Work<'_>, st: &Step, at: &Place, t0: usize, g: usize) -> R {
        let (c0, n) = (at.c0, at.n);
        let lw = self.lanes;
        let (before, out, after, end) = step_out(w.lanes, st.out, lw, g * n, "lane buffer")?;
        if let Code::Load { input } = st.code {
            let src =
                w.io.source(input, self.in_len[input], self.body.in_bool[input])?;
            let term = |t: usize| offset_of(t, &self.term_dims, &self.in_terms[input]);
            let base = self.plane_base(input, at.plane);
            let walk = (
                self.in_term[input],
                &term as &dyn Fn(usize) -> usize,
                self.in_col[input],
            );
            return match src {
                Source::F32(s) => load(s, out, base, walk, [t0, c0], n, |x| x),
                Source::Bool(s) => load(s, out, base, walk, [t0, c0], n, |b| f32::from(b != 0)),
            };
        }
        // A column-level operand differs from column to column: the chunk runs term by term.
        let per_term = st.args.iter().any(|a| matches!(a, Src::Row(_)));
        let (segs, seg) = if per_term { (g, n) } else { (1, g * n) };
        let rows = &*w.rows;
        let (before, after): (&[f32], &[f32]) = (before, after);
        let val = |s: Src, j: usize| {
            Ok(match s {
                Src::Const(c) => Val::One(c),
                Src::Row(b) => Val::Lanes(super::lanes::sub(rows, b * self.width, n)?),
                Src::Lanes(b) => Val::Lanes(super::lanes::sub(
                    other(before, after, end, lw, b)?,
                    j * seg,
                    seg,
                )?),
            })
        };
        for (j, o) in out.chunks_exact_mut(seg).take(segs).enumerate() {
            apply_lanes(st, |s| val(s, j), o)?;
        }
        Ok(())
    }
}

/// Where a block of columns is: its plane, its first column and its columns, and the columns
/// of all planes (a per-column output's elements).
struct Place {
    plane: usize,
    c0: usize,
    n: usize,
    total: usize,
}

/// The offset of index `i` of an odometer over `dims` (row-major) with `strides`.
#[inline]
pub(super) fn offset_of(mut i: usize, dims: &[usize], strides: &[usize]) -> usize {
    // One axis (the common case): no division.
    if let ([_], [s]) = (dims, strides) {
        return i.wrapping_mul(*s);
    }
    let mut at = 0usize;
    for (&d, &s) in dims.iter().zip(strides).rev() {
        at = at.wrapping_add((i % d).wrapping_mul(s));
        i /= d;
    }
    at
}

/// Copies terms `t0 ..` of columns `c0 .. c0 + n` of an input (element `offset + term(t) +
/// c·col`; `step`, where the reduced axes compose, the one stride of `term`) into `out`, `n`
/// lanes a term: one copy when the chunk is contiguous in the input, else a copy, a fill or a
/// gather per term.
#[inline(always)]
fn load<T: Copy>(
    src: &[T],
    out: &mut [f32],
    offset: usize,
    (step, term, col): (Option<usize>, &dyn Fn(usize) -> usize, usize),
    [t0, c0]: [usize; 2],
    n: usize,
    f: impl Fn(T) -> f32,
) -> R {
    let copy = |o: &mut [f32], s: &[T]| {
        for (o, &x) in o.iter_mut().zip(s) {
            *o = f(x);
        }
    };
    let oob = || KernelError::Internal("load outside its input");
    let at = |t: usize| {
        c0.checked_mul(col)
            .and_then(|x| x.checked_add(term(t)))
            .and_then(|x| x.checked_add(offset))
            .ok_or_else(oob)
    };
    if col == 1 && step == Some(n) {
        let start = at(t0)?;
        let s = start.checked_add(out.len()).and_then(|e| src.get(start..e));
        copy(out, s.ok_or_else(oob)?);
        return Ok(());
    }
    for (j, o) in out.chunks_exact_mut(n).enumerate() {
        let start = at(t0 + j)?;
        match col {
            0 => o.fill(f(*src.get(start).ok_or_else(oob)?)),
            1 => {
                let s = start.checked_add(n).and_then(|e| src.get(start..e));
                copy(o, s.ok_or_else(oob)?)
            }
            _ => {
                let last = (n - 1).checked_mul(col).and_then(|x| x.checked_add(start));
                let s = last.and_then(|l| src.get(start..=l)).ok_or_else(oob)?;
                for (o, &x) in o.iter_mut().zip(s.iter().step_by(col)) {
                    *o = f(x);
                }
            }
        }
    }
    Ok(())
}
