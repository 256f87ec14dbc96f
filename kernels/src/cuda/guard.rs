//! Guarded loads: a load whose value only ever reaches the branch of a `select` that one
//! condition picks (or the branch of nested selects that several conditions pick together) is
//! read only where those conditions hold.
//!
//! A causal softmax masks half of its scores (`select(j > i, -max, x * scale)`), and the
//! cross-entropy's pick of the target logit (`select(j == target, x - lse, 0)`) reads one
//! element of a row of 50304. Both read every element today. Here the loop over a row asks,
//! for every instruction, *where* its value is needed; a load needed only where `%c` is true
//! (or only where it is false) is written `v = c ? in[..] : 0`, which the GPU executes as a
//! predicated load: no memory traffic for the lanes (and whole warps) whose value is dropped.
//! The value that takes the load's place elsewhere is never observed: every path from the
//! load to a root passes through the `select`'s discarded side. All the kernel's ops are
//! total (no trap, no undefined behaviour on any input), so computing with the 0 is harmless.
//!
//! Nested selects give a conjunction: in a concat written as selects,
//! `select(p == 0, x0, select(p == 1, x1, x2))`, the last part is read only where
//! `!(p == 0) && !(p == 1)`, so each part is read once, where it is taken. Where a value is
//! needed under two different conjunctions, it keeps the literals they share.
//!
//! The analysis is per loop: the same load may be needed everywhere by one pass (a max) and
//! at a single element by the next. A load kept in registers across loops is read once, by
//! the first loop that reads it, so its guard must cover every loop (the caller joins them).
use crate::fused::check::operands;
use crate::fused::Inst;

/// Most literals a guard holds. Dropping literals from a conjunction only widens it (the load
/// is read in more places than needed, never in fewer), so a longer one is cut, not refused.
pub(super) const MAX_LITERALS: usize = 3;

/// A conjunction of literals "bool value `cond` equals `when`", sorted by `cond`, distinct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Conj {
    lits: [(usize, bool); MAX_LITERALS],
    len: usize,
}

impl Conj {
    /// The one literal `cond == when`.
    pub(super) fn literal(cond: usize, when: bool) -> Conj {
        let mut lits = [(0, false); MAX_LITERALS];
        lits[0] = (cond, when);
        Conj { lits, len: 1 }
    }

    pub(super) fn literals(&self) -> &[(usize, bool)] {
        &self.lits[..self.len]
    }

    fn from_sorted(it: impl Iterator<Item = (usize, bool)>) -> Conj {
        let mut lits = [(0, false); MAX_LITERALS];
        let mut len = 0;
        for l in it.take(MAX_LITERALS) {
            lits[len] = l;
            len += 1;
        }
        Conj { lits, len }
    }

    /// The literals whose conditions `keep` accepts (a wider conjunction), or `None` if none is.
    pub(super) fn retain(&self, mut keep: impl FnMut(usize) -> bool) -> Option<Conj> {
        let kept = Conj::from_sorted(self.literals().iter().copied().filter(|&(c, _)| keep(c)));
        (kept.len > 0).then_some(kept)
    }

    /// Where both hold: the union of the literals (`self`'s first when they do not all fit).
    fn and(&self, other: &Conj) -> Conj {
        let mut all: Vec<(usize, bool)> = self.literals().to_vec();
        for &l in other.literals() {
            if !all.iter().any(|&(c, _)| c == l.0) {
                all.push(l);
            }
        }
        all.truncate(MAX_LITERALS);
        all.sort_unstable();
        Conj::from_sorted(all.into_iter())
    }

    /// A conjunction that holds wherever either does: the literals they share.
    fn or(&self, other: &Conj) -> Option<Conj> {
        let shared = Conj::from_sorted(
            self.literals()
                .iter()
                .copied()
                .filter(|l| other.literals().contains(l)),
        );
        (shared.len > 0).then_some(shared)
    }
}

/// Where a value is needed within one loop over the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// Nothing in the loop reads it.
    Never,
    /// Only where every literal of the conjunction holds.
    When(Conj),
    /// At every element.
    Always,
}

impl Need {
    /// Needed where either is.
    pub(super) fn join(self, other: Need) -> Need {
        match (self, other) {
            (Need::Never, x) | (x, Need::Never) => x,
            (Need::When(a), Need::When(b)) => a.or(&b).map_or(Need::Always, Need::When),
            _ => Need::Always,
        }
    }

    /// Needed where `self` is and, inside that, where `inner` is: the conjunction.
    fn within(self, inner: Need) -> Need {
        match (self, inner) {
            (Need::Never, _) | (_, Need::Never) => Need::Never,
            (Need::Always, x) => x,
            (x, Need::Always) => x,
            (Need::When(a), Need::When(b)) => Need::When(a.and(&b)),
        }
    }
}

/// A load read only where every literal holds; 0 elsewhere.
pub(super) type Guard = Conj;

/// Where each full instruction of a loop is needed. `insts` are the loop's full instructions
/// (body order), `roots` those the loop consumes at every element (a reduction's operand, an
/// output); `row[i]` says whether instruction `i` is row-level (computed outside the loop).
pub(super) fn demand(body: &[Inst], row: &[bool], insts: &[usize], roots: &[usize]) -> Vec<Need> {
    let mut need = vec![Need::Never; body.len()];
    for &r in roots {
        if !row[r] {
            need[r] = Need::Always;
        }
    }
    for &i in insts.iter().rev() {
        let here = need[i];
        if here == Need::Never {
            continue;
        }
        let mut give = |o: usize, what: Need| {
            if !row[o] {
                need[o] = need[o].join(what);
            }
        };
        match body[i] {
            Inst::Select { cond, a, b } => {
                give(cond, here);
                give(a, here.within(Need::When(Conj::literal(cond, true))));
                give(b, here.within(Need::When(Conj::literal(cond, false))));
            }
            ref inst => {
                let (ops, c) = operands(inst);
                for &o in &ops[..c] {
                    give(o, here);
                }
            }
        }
    }
    need
}

/// The guards of the loop's loads: a load needed only where a conjunction holds is guarded by
/// its literals whose conditions can be computed before the load in this loop (row-level, or
/// a full instruction of the loop that does not read the load itself).
pub(super) fn guards(
    body: &[Inst],
    row: &[bool],
    insts: &[usize],
    need: &[Need],
) -> Vec<Option<Guard>> {
    let mut in_loop = vec![false; body.len()];
    for &i in insts {
        in_loop[i] = true;
    }
    let mut out = vec![None; body.len()];
    for &i in insts {
        if !matches!(body[i], Inst::Load { .. }) {
            continue;
        }
        if let Need::When(c) = need[i] {
            out[i] = c.retain(|cond| row[cond] || (in_loop[cond] && !reads(body, row, cond, i)));
        }
    }
    out
}

/// Whether full value `v` reads full value `x` (or is it).
fn reads(body: &[Inst], row: &[bool], v: usize, x: usize) -> bool {
    let mut stack = vec![v];
    let mut seen = vec![false; body.len()];
    while let Some(i) = stack.pop() {
        if i == x {
            return true;
        }
        if row[i] || std::mem::replace(&mut seen[i], true) {
            continue;
        }
        let (ops, c) = operands(&body[i]);
        stack.extend_from_slice(&ops[..c]);
    }
    false
}

/// The loop's instructions in an order that computes every guard before the load it guards:
/// body order, except that a guarded load waits for its condition (which, by [`guards`], does
/// not read it, so the order exists).
pub(super) fn order(
    body: &[Inst],
    row: &[bool],
    insts: &[usize],
    guard: &[Option<Guard>],
) -> Vec<usize> {
    let mut in_loop = vec![false; body.len()];
    for &i in insts {
        in_loop[i] = true;
    }
    let mut done = vec![false; body.len()];
    let mut out = Vec::with_capacity(insts.len());
    // Depth-first, operands (and a load's guard) first; the depth is bounded by the body.
    fn visit(
        i: usize,
        body: &[Inst],
        row: &[bool],
        in_loop: &[bool],
        guard: &[Option<Guard>],
        done: &mut [bool],
        out: &mut Vec<usize>,
    ) {
        if done[i] || row[i] || !in_loop[i] {
            return;
        }
        done[i] = true;
        if let Some(g) = guard[i] {
            for &(c, _) in g.literals() {
                visit(c, body, row, in_loop, guard, done, out);
            }
        }
        let (ops, c) = operands(&body[i]);
        for &o in &ops[..c] {
            visit(o, body, row, in_loop, guard, done, out);
        }
        out.push(i);
    }
    for &i in insts {
        visit(i, body, row, &in_loop, guard, &mut done, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryOp, CmpOp, DType, ReduceOp};

    /// `%0 load, %1 index, %2 const, %3 cmp(%1 > %2), %4 const, %5 select(%3, %4, %0)`.
    fn masked() -> Vec<Inst> {
        vec![
            Inst::Load { input: 0 },
            Inst::Index {
                axis: 0,
                dtype: DType::I32,
            },
            Inst::Const {
                value: 3.0,
                dtype: DType::I32,
            },
            Inst::Compare {
                op: CmpOp::Gt,
                a: 1,
                b: 2,
            },
            Inst::Const {
                value: 0.0,
                dtype: DType::F32,
            },
            Inst::Select {
                cond: 3,
                a: 4,
                b: 0,
            },
        ]
    }

    #[test]
    fn a_load_only_the_false_side_reads_is_guarded_by_the_negated_condition() {
        let body = masked();
        let row = vec![false, false, true, false, true, false];
        let insts = [0, 1, 3, 5];
        let need = demand(&body, &row, &insts, &[5]);
        assert_eq!(need[0], Need::When(Conj::literal(3, false)));
        assert_eq!(need[3], Need::Always);
        let g = guards(&body, &row, &insts, &need);
        assert_eq!(g[0], Some(Conj::literal(3, false)));
        // The condition is computed before the load it guards.
        let ord = order(&body, &row, &insts, &g);
        let at = |i| ord.iter().position(|&x| x == i).unwrap();
        assert!(at(3) < at(0), "{ord:?}");
        assert_eq!(ord.len(), insts.len());
    }

    #[test]
    fn a_load_also_read_outside_the_select_is_not_guarded() {
        let mut body = masked();
        // %6 = %5 + %0: the load is needed everywhere.
        body.push(Inst::Binary {
            op: BinaryOp::Add,
            a: 5,
            b: 0,
        });
        let row = vec![false, false, true, false, true, false, false];
        let insts = [0, 1, 3, 5, 6];
        let need = demand(&body, &row, &insts, &[6]);
        assert_eq!(need[0], Need::Always);
        assert_eq!(guards(&body, &row, &insts, &need)[0], None);
    }

    #[test]
    fn a_load_read_under_two_different_conditions_is_not_guarded() {
        let mut body = masked();
        // %6 = cmp(%1 < %2), %7 = select(%6, %0, %4), %8 = %5 + %7.
        body.push(Inst::Compare {
            op: CmpOp::Lt,
            a: 1,
            b: 2,
        });
        body.push(Inst::Select {
            cond: 6,
            a: 0,
            b: 4,
        });
        body.push(Inst::Binary {
            op: BinaryOp::Add,
            a: 5,
            b: 7,
        });
        let row = vec![false, false, true, false, true, false, false, false, false];
        let insts = [0, 1, 3, 5, 6, 7, 8];
        let need = demand(&body, &row, &insts, &[8]);
        assert_eq!(need[0], Need::Always);
    }

    #[test]
    fn a_condition_that_reads_the_load_cannot_guard_it() {
        // %0 load, %1 const, %2 cmp(%0 > %1), %3 select(%2, %0, %1).
        let body = vec![
            Inst::Load { input: 0 },
            Inst::Const {
                value: 0.0,
                dtype: DType::F32,
            },
            Inst::Compare {
                op: CmpOp::Gt,
                a: 0,
                b: 1,
            },
            Inst::Select {
                cond: 2,
                a: 0,
                b: 1,
            },
        ];
        let row = vec![false, true, false, false];
        let insts = [0, 2, 3];
        let need = demand(&body, &row, &insts, &[3]);
        // The compare reads the load everywhere anyway.
        assert_eq!(need[0], Need::Always);
        // Even if only the select needed it, the guard would read the load first.
        let forced = {
            let mut n = need.clone();
            n[0] = Need::When(Conj::literal(2, true));
            n
        };
        assert_eq!(guards(&body, &row, &insts, &forced)[0], None);
    }

    #[test]
    fn a_load_under_nested_selects_is_guarded_by_both_conditions() {
        // %0, %1 loads; %2 index; %3 const 0; %4 cmp(%2 == %3); %5 const 1; %6 cmp(%2 == %5);
        // %7 load; %8 select(%6, %1, %7); %9 select(%4, %0, %8): the concat of three parts.
        let body = vec![
            Inst::Load { input: 0 },
            Inst::Load { input: 1 },
            Inst::Index {
                axis: 0,
                dtype: DType::I32,
            },
            Inst::Const {
                value: 0.0,
                dtype: DType::I32,
            },
            Inst::Compare {
                op: CmpOp::Eq,
                a: 2,
                b: 3,
            },
            Inst::Const {
                value: 1.0,
                dtype: DType::I32,
            },
            Inst::Compare {
                op: CmpOp::Eq,
                a: 2,
                b: 5,
            },
            Inst::Load { input: 2 },
            Inst::Select {
                cond: 6,
                a: 1,
                b: 7,
            },
            Inst::Select {
                cond: 4,
                a: 0,
                b: 8,
            },
        ];
        let row = vec![
            false, false, false, true, false, true, false, false, false, false,
        ];
        let insts = [0, 1, 2, 4, 6, 7, 8, 9];
        let need = demand(&body, &row, &insts, &[9]);
        let lits = |n: Need| match n {
            Need::When(c) => c.literals().to_vec(),
            other => panic!("{other:?}"),
        };
        assert_eq!(lits(need[0]), vec![(4, true)]);
        assert_eq!(lits(need[1]), vec![(4, false), (6, true)]);
        assert_eq!(lits(need[7]), vec![(4, false), (6, false)]);
        let g = guards(&body, &row, &insts, &need);
        assert_eq!(
            g[7].map(|c| c.literals().to_vec()),
            Some(vec![(4, false), (6, false)])
        );
        let ord = order(&body, &row, &insts, &g);
        let at = |i| ord.iter().position(|&x| x == i).unwrap();
        assert!(at(4) < at(7) && at(6) < at(7), "{ord:?}");
    }

    #[test]
    fn a_value_needed_under_two_conjunctions_keeps_the_literals_they_share() {
        let a = Need::When(Conj::literal(4, false).and(&Conj::literal(6, true)));
        let b = Need::When(Conj::literal(4, false).and(&Conj::literal(6, false)));
        assert_eq!(a.join(b), Need::When(Conj::literal(4, false)));
        assert_eq!(
            Need::When(Conj::literal(6, true)).join(Need::When(Conj::literal(6, false))),
            Need::Always
        );
    }

    #[test]
    fn a_reduction_root_makes_its_operand_needed_everywhere() {
        let body = vec![
            Inst::Load { input: 0 },
            Inst::Reduce {
                op: ReduceOp::Sum,
                x: 0,
            },
        ];
        let row = vec![false, true];
        let need = demand(&body, &row, &[0], &[0]);
        assert_eq!(need[0], Need::Always);
    }
}
