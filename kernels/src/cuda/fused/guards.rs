//! The guards stage: which loads are read only where the conditions of the selects that use
//! them hold (a masked softmax reads no padding), from the per-loop demand that
//! [`crate::cuda::guard`] computes. The reduction, elementwise and tiled strategies all guard
//! their loads here, so that they read memory the same way.

use super::passes::Passes;
use super::Analysis;
use crate::cuda::guard::{self, Guard, Need};
use crate::cuda::literal;
use crate::fused::check::operands;
use crate::fused::Inst;

/// The literals of a guard computed from indices and constants alone, with the instructions
/// (body order) that compute them ([`Analysis::index_only_guard`]).
pub(super) type IndexGuard = (Guard, Vec<usize>);

impl Analysis<'_> {
    /// The guards of a reduction's loops over the row (the passes, then the output loop):
    /// where each loop needs each of its full values (the operands of its reductions, or the
    /// outputs), and from that, which loads it may skip. A cached load is read once, in the
    /// first loop that reads it, for all the loops: its need is the join of its needs in them.
    pub(super) fn loop_guards(&self, p: &Passes, cached: &[bool]) -> Vec<Vec<Option<Guard>>> {
        let k = self.k;
        let nb = k.body.len();
        let mut loop_sets: Vec<(&[usize], Vec<usize>)> = (1..=p.passes)
            .map(|s| {
                let roots = (p.reds.iter())
                    .filter(|&&r| self.stage[r] == s)
                    .filter_map(|&r| match k.body[r] {
                        Inst::Reduce { x, .. } => Some(x),
                        _ => None,
                    })
                    .collect();
                (&p.pass_full[s - 1][..], roots)
            })
            .collect();
        if p.full_outputs {
            let roots = k.outputs.iter().map(|o| o.value).collect();
            loop_sets.push((&p.final_full[..], roots));
        }
        let mut needs: Vec<Vec<Need>> = (loop_sets.iter())
            .map(|(insts, roots)| guard::demand(&k.body, &self.row, insts, roots))
            .collect();
        for i in (0..nb).filter(|&i| cached[i]) {
            let all = needs.iter().fold(Need::Never, |a, nd| a.join(nd[i]));
            for nd in &mut needs {
                if nd[i] != Need::Never {
                    nd[i] = all;
                }
            }
        }
        (loop_sets.iter().zip(&needs))
            .map(|((insts, _), nd)| {
                if self.tuning.unguarded_loads {
                    vec![None; nb]
                } else {
                    guard::guards(&k.body, &self.row, insts, nd)
                }
            })
            .collect()
    }

    /// The literals of `guard` whose conditions are computed from indices and constants alone,
    /// with the instructions that compute them (body order); `None` if no literal is.
    pub(super) fn index_only_guard(&self, guard: Guard) -> Option<IndexGuard> {
        let body = &self.k.body;
        let closure_of = |c: usize| -> Option<Vec<usize>> {
            let mut seen = vec![false; body.len()];
            let mut stack = vec![c];
            while let Some(i) = stack.pop() {
                if std::mem::replace(&mut seen[i], true) {
                    continue;
                }
                if matches!(body[i], Inst::Load { .. } | Inst::Reduce { .. }) {
                    return None;
                }
                let (ops, n) = operands(&body[i]);
                stack.extend_from_slice(&ops[..n]);
            }
            Some((0..body.len()).filter(|&i| seen[i]).collect())
        };
        let mut closure = Vec::new();
        let conj = guard.retain(|c| match closure_of(c) {
            Some(cl) => {
                closure.extend(cl);
                true
            }
            None => false,
        })?;
        closure.sort_unstable();
        closure.dedup();
        Some((conj, closure))
    }

    /// The guards of a loop that computes every value per element (the elementwise kernels):
    /// no value is row-level, the loop holds the live instructions, the outputs are its roots.
    /// Returns the row-level flags, the loop's instructions and each load's guard.
    pub(super) fn elementwise_guards(&self) -> (Vec<bool>, Vec<usize>, Vec<Option<Guard>>) {
        let k = self.k;
        let per_element = vec![false; k.body.len()];
        let insts: Vec<usize> = (0..k.body.len()).filter(|&i| self.live[i]).collect();
        let roots: Vec<usize> = k.outputs.iter().map(|o| o.value).collect();
        let g = if self.tuning.unguarded_loads {
            vec![None; k.body.len()]
        } else {
            let need = guard::demand(&k.body, &per_element, &insts, &roots);
            guard::guards(&k.body, &per_element, &insts, &need)
        };
        (per_element, insts, g)
    }

    /// Expression `e` of instruction `i`, read only where `guard` holds (0 elsewhere).
    pub(super) fn guarded(&self, e: String, i: usize, guard: Option<Guard>) -> String {
        match guard {
            None => e,
            Some(g) => {
                let zero = literal(0.0, self.dt[i]);
                match g.literals() {
                    [(c, true)] => format!("v{c} ? {e} : {zero}"),
                    [(c, false)] => format!("v{c} ? {zero} : {e}"),
                    lits => {
                        let cond: Vec<String> = lits
                            .iter()
                            .map(|&(c, w)| if w { format!("v{c}") } else { format!("!v{c}") })
                            .collect();
                        format!("({}) ? {e} : {zero}", cond.join(" && "))
                    }
                }
            }
        }
    }
}
