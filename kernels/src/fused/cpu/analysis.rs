//! The kernel's analysis: where things are in the scratch region, the case (flat, rows or
//! columns), the axes' and instructions' classes and the per-pass instruction lists.

use super::consts::{
    ALIGN, AX_RED, AX_T, BCAST, CONST, DIRECT, IN_BUFFER, LANE_BUDGET, LIVE, MAX_LANES, MIN_LANES,
    OUT_FULL, R, ROW, SKEW, SLOT, WORD, XFULL,
};
use crate::cpu::reduce::{FAN, LEVELS};
use crate::fused::check::{checked_numel, operands, KernelError};
use crate::fused::kernel::{FusedKernel, Inst};

/// Where things are in the scratch region: the analysis's tables, then the lane buffers, the
/// reductions' slots and the columns case's cascade levels.
pub(super) struct Layout {
    /// Bound on the number of passes: reductions + 1.
    pub(super) pb: usize,
    pub(super) lanes: usize,
    pub(super) meta_bytes: usize,
    /// One per buffer [`super::liveness::assign`] gives out, each `lanes * WORD + SKEW` bytes.
    pub(super) buf_bytes: usize,
    /// One [`SLOT`] per reduction slot.
    pub(super) part_bytes: usize,
    /// Upper cascade levels of the columns case's reductions, `LEVELS - 1` lane vectors per
    /// reduction slot; only for kernels whose reductions take more than [`FAN`] terms (0
    /// bytes otherwise).
    pub(super) level_bytes: usize,
    pub(super) total: usize,
}

impl Layout {
    /// The tables alone (buffers still 0 bytes), from the kernel's counts of instructions,
    /// reductions, axes and inputs: what the analysis needs before it runs.
    pub(super) fn tables(k: &FusedKernel) -> Option<Layout> {
        let n = k.body.len();
        let rank = k.domain.len();
        let n_red = k
            .body
            .iter()
            .filter(|i| matches!(i, Inst::Reduce { .. }))
            .count();
        let pb = n_red + 1;
        // An overflowing domain is refused later, by the check.
        let lanes = lane_count(n, checked_numel(&k.domain).unwrap_or(usize::MAX));
        // In the order `Meta::carve` takes them.
        let words = [
            n.checked_mul(10)?, // dt, flags, depth, mark, src, slot, part, by_start, by_end, free
            pb.checked_add(1)?, // eval_start
            pb.checked_mul(n)?, // eval
            pb.checked_add(1)?, // acc_start
            n,                  // acc
            pb.checked_add(2)?, // stage_start
            n,                  // stage
            rank.checked_mul(5)?, // idx, axis, t, o, k axes
            k.inputs.len().checked_mul(2)?, // blk, step
        ]
        .iter()
        .try_fold(0usize, |a, &w| a.checked_add(w))?;
        let meta_bytes = words
            .checked_mul(size_of::<usize>())?
            .checked_next_multiple_of(ALIGN)?;
        Some(Layout {
            pb,
            lanes,
            meta_bytes,
            buf_bytes: 0,
            part_bytes: 0,
            level_bytes: 0,
            total: ALIGN.checked_add(meta_bytes)?,
        })
    }

    /// The whole scratch: these tables and the buffers `b` that the analysis found.
    pub(super) fn with(&self, k: &FusedKernel, b: Buffers) -> Option<Layout> {
        let lanes = self.lanes;
        let buf_bytes = b.lanes.checked_mul(lanes * WORD + SKEW)?;
        let part_bytes = b.reductions.checked_mul(SLOT * WORD)?;
        let level_bytes = if long_columns(k) {
            b.reductions.checked_mul((LEVELS - 1) * lanes * WORD)?
        } else {
            0
        };
        let total = ALIGN
            .checked_add(self.meta_bytes)?
            .checked_add(buf_bytes)?
            .checked_add(part_bytes)?
            .checked_add(level_bytes)?;
        Some(Layout {
            pb: self.pb,
            lanes,
            meta_bytes: self.meta_bytes,
            buf_bytes,
            part_bytes,
            level_bytes,
            total,
        })
    }
}

/// Whether `k` takes the columns case (see [`analyze`]) with more than [`FAN`] terms per
/// reduction, so that its sums need cascade levels beyond their lane buffers.
pub(super) fn long_columns(k: &FusedKernel) -> bool {
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
pub(super) struct Meta<'a> {
    pub(super) dt: &'a mut [usize],
    pub(super) flags: &'a mut [usize],
    pub(super) depth: &'a mut [usize],
    pub(super) mark: &'a mut [usize],
    pub(super) src: &'a mut [usize],
    /// Per instruction: its lane buffer ([`super::liveness`]).
    pub(super) slot: &'a mut [usize],
    /// Per reduction: its slot among its pass's reductions ([`super::liveness`]).
    pub(super) part: &'a mut [usize],
    pub(super) by_start: &'a mut [usize],
    pub(super) by_end: &'a mut [usize],
    pub(super) free: &'a mut [usize],
    pub(super) eval_start: &'a mut [usize],
    pub(super) eval: &'a mut [usize],
    pub(super) acc_start: &'a mut [usize],
    pub(super) acc: &'a mut [usize],
    pub(super) stage_start: &'a mut [usize],
    pub(super) stage: &'a mut [usize],
    pub(super) idx: &'a mut [usize],
    pub(super) axis: &'a mut [usize],
    pub(super) t_axes: &'a mut [usize],
    pub(super) o_axes: &'a mut [usize],
    pub(super) k_axes: &'a mut [usize],
    pub(super) blk: &'a mut [usize],
    pub(super) step: &'a mut [usize],
}

pub(super) fn take<'a, T>(s: &mut &'a mut [T], n: usize) -> R<&'a mut [T]> {
    if n > s.len() {
        return Err(KernelError::Internal("scratch layout"));
    }
    let (a, b) = std::mem::take(s).split_at_mut(n);
    *s = b;
    Ok(a)
}

impl<'a> Meta<'a> {
    pub(super) fn carve(mut w: &'a mut [usize], k: &FusedKernel, pb: usize) -> R<Meta<'a>> {
        let (n, rank, ni) = (k.body.len(), k.domain.len(), k.inputs.len());
        let w = &mut w;
        Ok(Meta {
            dt: take(w, n)?,
            flags: take(w, n)?,
            depth: take(w, n)?,
            mark: take(w, n)?,
            src: take(w, n)?,
            slot: take(w, n)?,
            part: take(w, n)?,
            by_start: take(w, n)?,
            by_end: take(w, n)?,
            free: take(w, n)?,
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
pub(super) enum Case {
    Flat,
    Rows,
    Columns,
}

/// What the analysis found besides the tables.
pub(super) struct Info {
    pub(super) case: Case,
    pub(super) passes: usize,
    pub(super) n_t: usize,
    pub(super) nt: usize,
    pub(super) no: usize,
    pub(super) nk: usize,
}

/// Classifies axes and instructions and builds the per-pass instruction lists. `m.dt` must hold
/// the dtypes from a successful check.
pub(super) fn analyze(k: &FusedKernel, m: &mut Meta<'_>, pb: usize) -> R<Info> {
    let (case, n_t, nt, no, nk) = classify_axes(k, m);
    input_blocks(k, m, nt);
    classify_instructions(k, m, case);
    let passes = count_passes(k, m, case);
    if passes > pb {
        return Err(KernelError::Internal("more passes than planned"));
    }
    for i in 0..k.body.len() {
        let f = m.flags[i];
        if matches!(k.body[i], Inst::Load { .. }) && f & (XFULL | OUT_FULL) == XFULL {
            m.flags[i] |= DIRECT;
        }
    }
    m.src.fill(IN_BUFFER);
    pass_lists(k, m, case, passes);
    accumulations(k, m, case, passes);
    stages(k, m, passes)?;
    if case == Case::Rows {
        mark_broadcasts(k, m);
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

/// The case, and the axes of size > 1 split into chunk (`t`), outer reduced (`o`) and kept
/// (`k`) axes, in `m.axis` and the axis lists: `(case, n_t, nt, no, nk)`, `n_t` the chunk
/// axes' element count and `nt`, `no`, `nk` the lists' lengths.
pub(super) fn classify_axes(
    k: &FusedKernel,
    m: &mut Meta<'_>,
) -> (Case, usize, usize, usize, usize) {
    let rank = k.domain.len();
    let dims = &k.domain;
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
    (case, n_t, nt, no, nk)
}

/// Per input: how many consecutive chunk positions one stride covers.
pub(super) fn input_blocks(k: &FusedKernel, m: &mut Meta<'_>, nt: usize) {
    let dims = &k.domain;
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
}

/// Instructions: level, liveness, depth.
pub(super) fn classify_instructions(k: &FusedKernel, m: &mut Meta<'_>, case: Case) {
    let n = k.body.len();
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
}

/// The passes over each row: one for a flat kernel with outputs, else the deepest live
/// reduction's level (one more where a full output follows it).
pub(super) fn count_passes(k: &FusedKernel, m: &Meta<'_>, case: Case) -> usize {
    let mut passes = 0;
    if case == Case::Flat {
        passes = usize::from(!k.outputs.is_empty());
    } else {
        for i in 0..k.body.len() {
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
    passes
}

/// Pass p evaluates the full instructions that the reductions of level p + 1 (and, in the
/// last pass, the full outputs) need, in body order.
pub(super) fn pass_lists(k: &FusedKernel, m: &mut Meta<'_>, case: Case, passes: usize) {
    let n = k.body.len();
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
}

/// The reductions that accumulate in pass p.
pub(super) fn accumulations(k: &FusedKernel, m: &mut Meta<'_>, case: Case, passes: usize) {
    let mut c = 0;
    m.acc_start[0] = 0;
    for p in 0..passes {
        if case != Case::Flat {
            for i in 0..k.body.len() {
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
}

/// Row-level instructions of depth s are evaluated before pass s (after the last, for s =
/// passes); a reduction of depth s is finished there.
pub(super) fn stages(k: &FusedKernel, m: &mut Meta<'_>, passes: usize) -> R {
    let n = k.body.len();
    let mut c = 0;
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
    Ok(())
}

/// In the rows case, marks the row-level values that full instructions read lane by lane.
pub(super) fn mark_broadcasts(k: &FusedKernel, m: &mut Meta<'_>) {
    for i in 0..k.body.len() {
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

/// Lanes per chunk for a body of `n` instructions over `numel` domain elements: up to 1024,
/// fewer for long bodies, so that the lane buffers of f32 values stay near 32 KiB (most of them
/// are dead at any one time), and no more than the smallest power of two (at least
/// [`MIN_LANES`]) that covers the domain: no chunk of any case is longer than the domain, so
/// lanes beyond it would be scratch that nothing reads (a kernel over 64 elements took 1,024
/// lanes, 8 KiB a buffer). Every chunk keeps its length, so results do not change.
pub(super) fn lane_count(n: usize, numel: usize) -> usize {
    let by_body = ((LANE_BUDGET / n.max(1)) / 8 * 8).clamp(MIN_LANES, MAX_LANES);
    let by_domain = numel
        .checked_next_power_of_two()
        .unwrap_or(MAX_LANES)
        .clamp(MIN_LANES, MAX_LANES);
    by_body.min(by_domain)
}

/// How many lane buffers and reduction slots the kernel needs, after `liveness::assign`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Buffers {
    /// Lane buffers (`m.slot` indexes them).
    pub(super) lanes: usize,
    /// Reduction slots (rows case) or cascade level sets (columns case): the most reductions
    /// one pass accumulates (`m.part` indexes them).
    pub(super) reductions: usize,
}

/// The items of entry `p` of a list flattened with its start offsets (`items[start[p]..start[p + 1]]`;
/// none where `p` is out of range): how the analysis stores per-instruction lists.
pub(super) fn list<'a>(start: &[usize], items: &'a [usize], p: usize) -> &'a [usize] {
    match (start.get(p), start.get(p + 1)) {
        (Some(&a), Some(&b)) => items.get(a..b).unwrap_or(&[]),
        _ => &[],
    }
}
