//! Guarded loads: a load whose value only ever reaches the branch of a `select` that one
//! condition picks is read only where that condition holds.
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
//! The analysis is per loop: the same load may be needed everywhere by one pass (a max) and
//! at a single element by the next. A load kept in registers across loops is read once, by
//! the first loop that reads it, so its guard must cover every loop (the caller joins them).
use crate::fused::check::operands;
use crate::fused::Inst;

/// Where a value is needed within one loop over the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// Nothing in the loop reads it.
    Never,
    /// Only where the bool value `cond` equals `when`.
    When { cond: usize, when: bool },
    /// At every element.
    Always,
}

impl Need {
    /// Needed where either is.
    pub(super) fn join(self, other: Need) -> Need {
        match (self, other) {
            (Need::Never, x) | (x, Need::Never) => x,
            (a, b) if a == b => a,
            _ => Need::Always,
        }
    }

    /// Needed where `self` is and, inside that, where `inner` is: the conjunction, or a
    /// condition that covers it (one literal cannot say "both", so the outer one stays).
    fn within(self, inner: Need) -> Need {
        match (self, inner) {
            (Need::Never, _) => Need::Never,
            (Need::Always, x) => x,
            (outer, _) => outer,
        }
    }
}

/// A load read only where `cond` (a bool value) equals `when`; 0 elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Guard {
    pub cond: usize,
    pub when: bool,
}

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
                give(a, here.within(Need::When { cond, when: true }));
                give(b, here.within(Need::When { cond, when: false }));
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

/// The guards of the loop's loads: a load needed only under one condition gets it when the
/// condition can be computed before the load in this loop (row-level, or a full instruction
/// of the loop that does not read the load itself).
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
        if let Need::When { cond, when } = need[i] {
            let ready = row[cond] || (in_loop[cond] && !reads(body, row, cond, i));
            if ready {
                out[i] = Some(Guard { cond, when });
            }
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
            visit(g.cond, body, row, in_loop, guard, done, out);
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
        assert_eq!(
            need[0],
            Need::When {
                cond: 3,
                when: false
            }
        );
        assert_eq!(need[3], Need::Always);
        let g = guards(&body, &row, &insts, &need);
        assert_eq!(
            g[0],
            Some(Guard {
                cond: 3,
                when: false
            })
        );
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
            n[0] = Need::When {
                cond: 2,
                when: true,
            };
            n
        };
        assert_eq!(guards(&body, &row, &insts, &forced)[0], None);
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
