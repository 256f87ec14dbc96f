//! Lane buffers by liveness: an instruction's lane buffer is given to a later instruction once
//! the last reader of its value has run, so a kernel's scratch grows with the values live at
//! once, not with its length (a 2,000-instruction elementwise chain needs three buffers, not
//! 2,000). The same interval colouring the slab planner does, local to one kernel and simple:
//! intervals on one walk of the kernel's schedule, sorted by start, each given the buffer
//! freed earliest... in fact the last one freed (a stack), which is deterministic and as good
//! for interval graphs: a buffer is only reused when its value is dead.
//!
//! # The walk
//! The schedule of one row (rows case), one chunk of kept lanes (columns case) or the whole
//! domain (flat) is, in order: stage 0; then per pass `p`: the pass's body (its columns
//! reductions start at the identity, its evaluation list, its accumulations, the full stores
//! of the last pass, the columns sums finished and rounded) and stage `p + 1`; then the stores
//! of row-level outputs. Each step is one position. A value is live from the first position
//! that writes it to the last that reads it, except:
//! - the body repeats (chunks, runs, terms): a value it reads but does not evaluate in that
//!   pass (a row-level value, a constant, a reduction accumulating there) stays live to the
//!   body's end, so that no value evaluated in the body writes over it before the next round;
//! - constants are evaluated once per run: live over the whole walk;
//! - a value read before anything in the walk writes it (none should be) stays live over the
//!   whole walk, so that a mistake here costs bytes, never a value.
//!
//! A value the body evaluates in several passes (recomputed, never stored) keeps its buffer
//! from its first evaluation to its last read: one interval per value.
//!
//! Rows-case reduction slots and columns-case cascade levels are in use from their pass's start
//! to the stage after it, the same for every reduction of a pass: each reduction takes the slot
//! of its index among its pass's reductions, so there are as many as the busiest pass has.

use super::analysis::{list, Buffers, Case, Info, Meta};
use super::consts::{CONST, LIVE, R, XFULL};
use crate::fused::check::operands;
use crate::fused::kernel::{FusedKernel, Inst};

/// `start`/`end` of a value that nothing writes (no buffer).
const NONE: usize = usize::MAX;

/// The live intervals of one walk, in `start` and `end` (the analysis's `mark` and `depth`,
/// free once it is done).
struct Walk<'m, 'a> {
    m: &'m mut Meta<'a>,
    /// The position the walk is at.
    t: usize,
}

impl Walk<'_, '_> {
    /// Instruction `i` writes its buffer at the current position.
    fn def(&mut self, i: usize) {
        let t = self.t;
        let m = &mut *self.m;
        if m.mark[i] == NONE {
            m.mark[i] = t;
        }
        m.depth[i] = Ord::max(m.depth[i], t);
    }

    /// Value `j` is read at the current position; `body_end`, when the read is in a pass's
    /// body that does not evaluate `j`, is where the body ends.
    fn read(&mut self, j: usize, body_end: Option<usize>) {
        let t = self.t;
        let m = &mut *self.m;
        if m.mark[j] == NONE || m.mark[j] > t {
            // Read before written: live over the whole walk (see the module docs).
            m.mark[j] = 0;
            m.depth[j] = usize::MAX - 1;
        }
        m.depth[j] = Ord::max(Ord::max(m.depth[j], t), body_end.unwrap_or(0));
    }

    fn next(&mut self) {
        self.t += 1;
    }
}

/// Gives every live instruction a lane buffer (`m.slot`) and every reduction a slot among its
/// pass's (`m.part`), and says how many of each there are. Needs the analysis ([`analyze`]);
/// uses `m.mark`, `m.depth`, `m.by_start`, `m.by_end` and `m.free` as its own.
pub(super) fn assign(k: &FusedKernel, m: &mut Meta<'_>, info: &Info) -> R<Buffers> {
    let n = k.body.len();
    let reductions = reduction_slots(k, m, info.passes);
    intervals(k, m, info);
    // Constants and values read before they are written: the whole walk.
    let end = m.depth.iter().filter(|&&e| e != usize::MAX - 1).max();
    let whole = end.map_or(0, |&e| e + 1);
    for i in 0..n {
        let live = m.flags[i] & LIVE != 0;
        if !live {
            m.mark[i] = NONE;
        } else if m.flags[i] & CONST != 0 || m.depth[i] == usize::MAX - 1 || m.mark[i] == NONE {
            m.mark[i] = 0;
            m.depth[i] = whole;
        }
    }
    let lanes = colour(m, n);
    Ok(Buffers { lanes, reductions })
}

/// The pass-local index of each reduction (`m.part`), and the most one pass holds.
fn reduction_slots(k: &FusedKernel, m: &mut Meta<'_>, passes: usize) -> usize {
    m.part.fill(NONE);
    let mut most = 0;
    for p in 0..passes {
        let rs = list(m.acc_start, m.acc, p);
        most = Ord::max(most, rs.len());
        for (q, &r) in rs.iter().enumerate() {
            m.part[r] = q;
        }
    }
    // Rows case: a reduction of a stage is finished from its slot; one that no pass
    // accumulates (none should) still gets a slot of its own.
    for i in 0..k.body.len() {
        if matches!(k.body[i], Inst::Reduce { .. }) && m.part[i] == NONE {
            m.part[i] = most;
            most += 1;
        }
    }
    most
}

/// The live interval of every value on the walk (module docs), in `m.mark` (start) and
/// `m.depth` (end).
fn intervals(k: &FusedKernel, m: &mut Meta<'_>, info: &Info) {
    let columns = info.case == Case::Columns;
    m.mark.fill(NONE);
    m.depth.fill(0);
    // `free` marks, per pass, the values its body evaluates.
    m.free.fill(NONE);
    let mut w = Walk { m, t: 1 };
    for s in 0..=info.passes {
        for q in 0..list(w.m.stage_start, w.m.stage, s).len() {
            let i = list(w.m.stage_start, w.m.stage, s)[q];
            w.next();
            if matches!(k.body[i], Inst::Reduce { .. }) {
                // Rows: finished from its slot into its buffer; columns: its buffer holds it.
                if columns {
                    w.read(i, None);
                } else {
                    w.def(i);
                }
            } else {
                let (ops, c) = operands(&k.body[i]);
                for &o in &ops[..c] {
                    w.read(o, None);
                }
                w.def(i);
            }
        }
        if s < info.passes {
            body(k, &mut w, s, s + 1 == info.passes, columns);
        }
    }
    w.next();
    for out in &k.outputs {
        if w.m.flags[out.value] & XFULL == 0 {
            w.read(out.value, None);
        }
    }
}

/// Pass `p`'s body on the walk.
fn body(k: &FusedKernel, w: &mut Walk<'_, '_>, p: usize, last: bool, columns: bool) {
    let evals = list(w.m.eval_start, w.m.eval, p).len();
    let accs = list(w.m.acc_start, w.m.acc, p).len();
    // Positions: the start, each evaluation, the accumulations, the stores, the finish.
    let end = w.t + 1 + evals + 1 + 1 + 1;
    for q in 0..evals {
        let i = list(w.m.eval_start, w.m.eval, p)[q];
        w.m.free[i] = p;
    }
    let outside = |w: &Walk<'_, '_>, j: usize| (w.m.free[j] != p).then_some(end);
    w.next();
    if columns {
        for q in 0..accs {
            let r = list(w.m.acc_start, w.m.acc, p)[q];
            w.def(r);
        }
    }
    for q in 0..evals {
        let i = list(w.m.eval_start, w.m.eval, p)[q];
        w.next();
        let (ops, c) = operands(&k.body[i]);
        for &o in &ops[..c] {
            let e = outside(w, o);
            w.read(o, e);
        }
        w.def(i);
    }
    w.next();
    for q in 0..accs {
        let r = list(w.m.acc_start, w.m.acc, p)[q];
        if let Inst::Reduce { x, .. } = k.body[r] {
            let e = outside(w, x);
            w.read(x, e);
        }
        if columns {
            w.read(r, Some(end));
        }
    }
    w.next();
    if last {
        for out in &k.outputs {
            if w.m.flags[out.value] & XFULL != 0 {
                let e = outside(w, out.value);
                w.read(out.value, e);
            }
        }
    }
    w.next();
    debug_assert_eq!(w.t, end);
}

/// Colours the intervals: in order of start, each value takes the buffer most recently freed
/// by a value whose last read came before its start, or a new one. Returns the buffers used.
fn colour(m: &mut Meta<'_>, n: usize) -> usize {
    let mut live = 0;
    for i in 0..n {
        m.slot[i] = NONE;
        if m.mark[i] != NONE {
            m.by_start[live] = i;
            m.by_end[live] = i;
            live += 1;
        }
    }
    let (start, end) = (&*m.mark, &*m.depth);
    m.by_start[..live].sort_unstable_by_key(|&i| (start[i], i));
    m.by_end[..live].sort_unstable_by_key(|&i| (end[i], i));
    let (mut used, mut free, mut e) = (0, 0, 0);
    for q in 0..live {
        let i = m.by_start[q];
        // Free the buffers of the values dead before `i` is written.
        while e < live && end[m.by_end[e]] < start[i] {
            m.free[free] = m.slot[m.by_end[e]];
            free += 1;
            e += 1;
        }
        m.slot[i] = if free > 0 {
            free -= 1;
            m.free[free]
        } else {
            used += 1;
            used - 1
        };
    }
    used
}

#[cfg(test)]
mod tests {
    use super::super::analysis::Layout;
    use super::super::consts::{SKEW, WORD};
    use super::super::interpret::prepare;
    use super::super::{run_buffers, scratch_bytes};
    use crate::fused::{sample, FusedKernel};

    /// `x * 0.75 + 0.5`, `ops` times in turn, over f32[`len`] ([`sample::chain`]).
    fn chain(ops: usize, len: usize) -> FusedKernel {
        sample::chain(ops, &[len], false)
    }

    /// The scratch's layout for `k`, as `run` lays it out.
    fn layout(k: &FusedKernel) -> Layout {
        let tables = Layout::tables(k).unwrap();
        let mut words = vec![0usize; tables.meta_bytes / size_of::<usize>()];
        prepare(k, &mut words, &tables).unwrap().2
    }

    #[test]
    fn a_long_chains_lane_buffers_do_not_grow_with_its_length() {
        // Long enough that both take the fewest lanes per chunk.
        let (short, long) = (layout(&chain(1_000, 64)), layout(&chain(4_000, 64)));
        assert_eq!(short.lanes, long.lanes);
        let buffers = |l: &Layout| l.buf_bytes + l.part_bytes + l.level_bytes;
        // The two constants, the value being computed and the one it reads.
        let stride = long.lanes * WORD + SKEW;
        assert_eq!(
            buffers(&long),
            4 * stride,
            "{} B of lane buffers",
            buffers(&long)
        );
        assert_eq!(buffers(&short), buffers(&long));
        // What grows is the analysis's tables alone, each instruction's few words.
        let k = chain(4_000, 64);
        assert_eq!(scratch_bytes(&k), long.total);
        assert!(
            long.total <= 4_003 * 200 + 4 * stride + 1024,
            "{} B of scratch for 4,003 instructions",
            long.total
        );
    }

    #[test]
    fn a_long_chain_whose_buffers_are_reused_computes_the_sequential_values() {
        let len = 3_000;
        let k = chain(2_001, len);
        let x: Vec<f32> = (0..len).map(|i| (i as f32 - 1500.0) / 7.0).collect();
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let out = run_buffers(&k, &[&bytes]).unwrap();
        for (i, (&x, got)) in x.iter().zip(out[0].chunks_exact(4)).enumerate() {
            let mut want = x;
            for o in 0..2_001 {
                want = if o % 2 == 0 { want * 0.75 } else { want + 0.5 };
            }
            let got = f32::from_ne_bytes(got.try_into().unwrap());
            assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
        }
    }
}
