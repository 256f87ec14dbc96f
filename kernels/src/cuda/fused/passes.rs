//! The strategy stage of a reduction that decides what each loop over the row computes: one
//! pass per reduction level, then a final loop for the per-element outputs.

use super::analysis::Analysis;
use crate::fused::check::operands;
use crate::fused::Inst;
use crate::{BinaryOp, DType, ReduceOp, UnaryOp};

/// What a reduction's passes compute (see [`Analysis::passes`]).
pub(super) struct Passes {
    /// The live reductions, in body order.
    pub(super) reds: Vec<usize>,
    /// How many passes over the row: the largest reduction stage.
    pub(super) passes: usize,
    /// Whether some output is per element (written by a final loop over the row).
    pub(super) full_outputs: bool,
    /// The full (per element) instructions each pass computes (pass p at index p - 1).
    pub(super) pass_full: Vec<Vec<usize>>,
    /// The full instructions the final output loop computes.
    pub(super) final_full: Vec<usize>,
    /// Full instructions some loop computes.
    pub(super) emitted_full: Vec<bool>,
    /// Row-level values something reads.
    pub(super) needed: Vec<bool>,
    /// How many of the loops over the row read each load (more than one: worth caching).
    pub(super) loop_uses: Vec<usize>,
}

/// A sum of exponentials computed online ([`Analysis::online_sums`]): `sum` is
/// `Σ exp(x - max)` where `max` is the maximum of the same `x` over the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OnlineSum {
    pub(super) sum: usize,
    pub(super) max: usize,
    pub(super) x: usize,
}

impl Analysis<'_> {
    /// The second pass's reductions, when every one of them is a sum of exponentials
    /// `Σ exp(x - max(x))` over the first pass's maximum (a softmax's or a cross-entropy's
    /// denominator), all in f32: such a sum can be taken in the first pass, beside the maximum
    /// it needs, each thread keeping its sum relative to its own running maximum and rescaling
    /// it when the maximum grows, then to the row's maximum before the threads combine
    /// (Milakov and Gimelshein's online softmax). That saves the second pass's loop over the
    /// row. Empty otherwise.
    pub(super) fn online_sums(&self, p: &Passes) -> Vec<OnlineSum> {
        let body = &self.k.body;
        let mut sums = Vec::new();
        for &s in p.reds.iter().filter(|&&r| self.stage[r] == 2) {
            let found = match body[s] {
                Inst::Reduce {
                    op: ReduceOp::Sum,
                    x: t,
                } => match body[t] {
                    Inst::Unary {
                        op: UnaryOp::Exp,
                        x: d,
                    } => match body[d] {
                        Inst::Binary {
                            op: BinaryOp::Sub,
                            a: x,
                            b: m,
                        } => match body[m] {
                            Inst::Reduce {
                                op: ReduceOp::Max,
                                x: x2,
                            } if x2 == x && self.stage[m] == 1 && !self.row[x] => {
                                let f32s =
                                    [s, t, d, x, m].iter().all(|&i| self.dt[i] == DType::F32);
                                f32s.then_some(OnlineSum { sum: s, max: m, x })
                            }
                            _ => None,
                        },
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            };
            match found {
                Some(o) => sums.push(o),
                None => return Vec::new(),
            }
        }
        sums
    }

    /// The strategy stage of a reduction: which instructions each pass over the row and the
    /// final output loop compute, and which row-level values are read. Reductions whose operand
    /// needs an earlier reduction's result run in a later pass, so a softmax takes two passes
    /// (max, then the sum of exponentials) plus the output loop.
    pub(super) fn passes(&self) -> Passes {
        let k = self.k;
        let n = self.n;
        let nb = k.body.len();
        let reds: Vec<usize> = (0..nb)
            .filter(|&i| self.live[i] && matches!(k.body[i], Inst::Reduce { .. }))
            .collect();
        let passes = reds.iter().map(|&r| self.stage[r]).max().unwrap_or(0);
        let full_outputs = self.has_full_outputs() && n > 0;
        // Full instructions each pass needs (pass p at index p - 1; the final pass last).
        let mut pass_full: Vec<Vec<usize>> = Vec::new();
        for p in 1..=passes {
            let roots: Vec<usize> = reds
                .iter()
                .filter(|&&r| self.stage[r] == p)
                .map(|&r| match k.body[r] {
                    Inst::Reduce { x, .. } => x,
                    _ => r,
                })
                .collect();
            pass_full.push(self.full_closure(&roots));
        }
        let final_full = if full_outputs {
            let roots: Vec<usize> = k
                .outputs
                .iter()
                .map(|o| o.value)
                .filter(|&v| !self.row[v])
                .collect();
            self.full_closure(&roots)
        } else {
            Vec::new()
        };

        // The row-level values something reads: the row-level outputs, the operands of the full
        // instructions the loops compute and of the reductions; with empty rows, a reduction is
        // its identity and reads nothing.
        let mut emitted_full = vec![false; nb];
        if n > 0 {
            for &i in pass_full.iter().flatten().chain(&final_full) {
                emitted_full[i] = true;
            }
        }
        let mut needed = vec![false; nb];
        for o in &k.outputs {
            if self.row[o.value] {
                needed[o.value] = true;
            }
        }
        for i in (0..nb).rev() {
            let reads = emitted_full[i]
                || (needed[i] && !(n == 0 && matches!(k.body[i], Inst::Reduce { .. })));
            if reads || (n > 0 && reds.contains(&i)) {
                let (ops, c) = operands(&k.body[i]);
                for &o in &ops[..c] {
                    if self.row[o] {
                        needed[o] = true;
                    }
                }
            }
        }

        // Loads the loops over the row read, and how many of the loops read each.
        let mut loop_uses = vec![0usize; nb];
        if n > 0 {
            for &i in pass_full.iter().flatten().chain(&final_full) {
                if matches!(k.body[i], Inst::Load { .. }) {
                    loop_uses[i] += 1;
                }
            }
        }
        Passes {
            reds,
            passes,
            full_outputs,
            pass_full,
            final_full,
            emitted_full,
            needed,
            loop_uses,
        }
    }
}
