//! Sums of linear combinations taken apart, so that a reduction that reads a reduction is
//! computed from first-stage sums: a kernel's reduction **stages** ([`super::staged`]) fewer.
//!
//! Batch norm's data gradient, as autodiff writes it, sums a value that reads the gradient's
//! own first sums: with `xc = x − mean`, `d = dy·γ`, and `k` the variance's gradient over the
//! count (a row value made from `Σ(d·xc)`),
//!
//! ```text
//! dxc = d·rstd + k·xc + k·xc        (full)
//! Σdxc                              (a second stage: it reads k, which reads a first sum)
//! dx  = dxc − Σdxc / n
//! ```
//!
//! Split by stages on the GPU, that second sum is a second partial kernel that reads every
//! input again (resnet50's channels-last backward: about 7.5 GB a step, docs/benchmarks.md,
//! session 43). Yet a sum over the reduce axes of `c·f`, where `c` is the same along them (a
//! row-level value), is `c·Σf`; and `Σ(a ± b) = Σa ± Σb`. So
//! `Σdxc = (Σdy)·γ·rstd + k·Σxc + k·Σxc`, where `Σdy` is a first-stage sum the kernel already
//! has and `Σxc` a new one that reads what the first stage reads: one stage, one pass fewer.
//!
//! [`distributed`] rewrites each sum of a value that reads a reduction this way: its operand
//! is taken apart through `+`, `−`, negation, and products and quotients by row-level values,
//! down to **terms** `±c₁·c₂·…·f` whose full part `f` reads reductions of lower stages only
//! (so its sum is a stage lower), and the sum becomes `±(Σf)·c₁·c₂·…` summed over the terms,
//! each `Σf` an existing sum of `f` where the kernel has one. A value of a lower stage is taken
//! apart only through products (to reuse an existing sum of its factor), never through `+`,
//! which would make two sums of one. Where any part of the operand is not linear in its full
//! parts (`exp`, a product of two full values, a conversion, a select), or a row-level value is
//! added to a full one (`Σ(f − r) = Σf − n·r` subtracts two nearly equal numbers where `r` is
//! near `f`'s mean, the cancellation a two-pass variance avoids), the sum is kept.
//!
//! Values are the original's up to the order of float operations (products by the factors
//! after the sum instead of before it, sums of the parts added instead of summed together);
//! only f32 and f64 sums are taken apart (a bf16 sum rounds its result, a linear combination
//! of rounded sums would not be that). The CPU runs a kernel as written; the CUDA generator
//! runs a kernel split by stages in this form, and is checked against the CPU interpreter.

use super::check::operands;
use super::split::{needed, renamed};
use super::{FusedKernel, Inst, Output};
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use crate::DType;

/// One term of a sum's operand: `±f·c₁·c₂·…`, `f` a full value (its instruction), each factor
/// a row-level instruction and whether it divides.
#[derive(Clone, Debug, PartialEq)]
struct Term {
    leaf: usize,
    negative: bool,
    factors: Vec<(usize, bool)>,
}

/// What the rewrite reads of the original kernel.
struct Facts<'a> {
    k: &'a FusedKernel,
    row: Vec<bool>,
    stage: Vec<usize>,
    /// The first sum of each instruction in the body, if any.
    sum_of: Vec<Option<usize>>,
}

impl Facts<'_> {
    /// Whether the body sums `i` before instruction `before`.
    fn summed_before(&self, i: usize, before: usize) -> bool {
        self.sum_of[i].is_some_and(|r| r < before)
    }

    /// Appends to `out` the terms of full value `i` (times `factors`, negated where
    /// `negative`) for the sum at `target`, whose operand is of stage `top`; false where `i`
    /// is not taken apart into terms of stages below `top` (see the module docs).
    fn terms(
        &self,
        i: usize,
        target: usize,
        top: usize,
        negative: bool,
        factors: &mut Vec<(usize, bool)>,
        out: &mut Vec<Term>,
    ) -> bool {
        if self.row[i] {
            return false;
        }
        let low = self.stage[i] < top;
        if !(low && self.summed_before(i, target)) {
            // Through a negation, a product or quotient by a row-level value, and (at the
            // sum's own stage) a sum or difference of full values.
            let row = &self.row;
            let scaled = match self.k.body[i] {
                Inst::Unary {
                    op: UnaryOp::Neg,
                    x,
                } => return self.terms(x, target, top, !negative, factors, out),
                Inst::Binary {
                    op: BinaryOp::Mul,
                    a,
                    b,
                } if row[a] != row[b] => Some(if row[a] { (a, false, b) } else { (b, false, a) }),
                Inst::Binary {
                    op: BinaryOp::Div,
                    a,
                    b,
                } if row[b] && !row[a] => Some((b, true, a)),
                Inst::Binary {
                    op: op @ (BinaryOp::Add | BinaryOp::Sub),
                    a,
                    b,
                } if !low && !row[a] && !row[b] => {
                    let minus = op == BinaryOp::Sub;
                    return self.terms(a, target, top, negative, factors, out)
                        && self.terms(b, target, top, negative != minus, factors, out);
                }
                _ => None,
            };
            if let Some((f, divide, x)) = scaled {
                factors.push((f, divide));
                let ok = self.terms(x, target, top, negative, factors, out);
                factors.pop();
                return ok;
            }
        }
        if !low {
            return false;
        }
        out.push(Term {
            leaf: i,
            negative,
            factors: factors.clone(),
        });
        true
    }
}

/// Each instruction's stage: 0 for values that read no reduction, a reduction's is its
/// operand's plus one, an op's the largest of its operands'.
pub(super) fn stages(k: &FusedKernel) -> Vec<usize> {
    let mut stage = vec![0usize; k.body.len()];
    for (i, inst) in k.body.iter().enumerate() {
        let (ops, n) = operands(inst);
        let s = ops[..n].iter().map(|&o| stage[o]).max().unwrap_or(0);
        stage[i] = s + usize::from(matches!(inst, Inst::Reduce { .. }));
    }
    stage
}

/// The largest stage of a reduction the kernel's outputs need (0 for none): the passes over
/// its rows a reduction kernel makes before its last, one partial kernel each where it is
/// split by stages ([`super::staged`]).
pub fn depth(k: &FusedKernel) -> usize {
    let stage = stages(k);
    let live = needed(
        k,
        k.outputs.iter().map(|o| o.value),
        &vec![false; k.body.len()],
    );
    (0..k.body.len())
        .filter(|&i| live[i] && matches!(k.body[i], Inst::Reduce { .. }))
        .map(|i| stage[i])
        .max()
        .unwrap_or(0)
}

/// `k` with each sum that reads a reduction computed from sums of lower stages where its
/// operand is a linear combination of such values (see the module docs); `None` where that
/// leaves [`depth`] as it is (nothing taken apart, or a sum of the last stage kept), or `k`
/// does not check.
pub fn distributed(k: &FusedKernel) -> Option<FusedKernel> {
    k.check().ok()?;
    let dt = k.dtypes();
    let n = k.body.len();
    let mut sum_of = vec![None; n];
    for (r, inst) in k.body.iter().enumerate() {
        if let Inst::Reduce {
            op: ReduceOp::Sum,
            x,
        } = *inst
        {
            sum_of[x].get_or_insert(r);
        }
    }
    let facts = Facts {
        k,
        row: k.row_levels(),
        stage: stages(k),
        sum_of,
    };
    let live = needed(k, k.outputs.iter().map(|o| o.value), &vec![false; n]);
    let mut plan: Vec<Option<Vec<Term>>> = vec![None; n];
    for (r, inst) in k.body.iter().enumerate() {
        let Inst::Reduce {
            op: ReduceOp::Sum,
            x,
        } = *inst
        else {
            continue;
        };
        let top = facts.stage[x];
        if !live[r] || top == 0 || facts.row[x] || !matches!(dt[x], DType::F32 | DType::F64) {
            continue;
        }
        let mut terms = Vec::new();
        if facts.terms(x, r, top, false, &mut Vec::new(), &mut terms) {
            plan[r] = Some(terms);
        }
    }
    if plan.iter().all(Option::is_none) {
        return None;
    }
    let out = rebuild(k, &plan);
    (out.check().is_ok() && depth(&out) < depth(k)).then_some(out)
}

/// `k`'s body with each sum `plan` takes apart replaced by its terms' sums: each term's sum (an
/// earlier sum of its full part where the body has one, else a new one, made once) times its
/// factors, innermost first, the terms added in order.
fn rebuild(k: &FusedKernel, plan: &[Option<Vec<Term>>]) -> FusedKernel {
    let n = k.body.len();
    let mut body: Vec<Inst> = Vec::with_capacity(n + 8);
    let mut map = vec![usize::MAX; n];
    // The new body's sum of each original instruction, once made or met.
    let mut sum = vec![None::<usize>; n];
    let push = |body: &mut Vec<Inst>, inst: Inst| {
        body.push(inst);
        body.len() - 1
    };
    for (i, inst) in k.body.iter().enumerate() {
        let Some(terms) = &plan[i] else {
            map[i] = push(&mut body, renamed(inst, &map));
            if let Inst::Reduce {
                op: ReduceOp::Sum,
                x,
            } = *inst
            {
                sum[x].get_or_insert(map[i]);
            }
            continue;
        };
        let mut acc: Option<usize> = None;
        for t in terms {
            let s = match sum[t.leaf] {
                Some(s) => s,
                None => {
                    let s = push(
                        &mut body,
                        Inst::Reduce {
                            op: ReduceOp::Sum,
                            x: map[t.leaf],
                        },
                    );
                    sum[t.leaf] = Some(s);
                    s
                }
            };
            let mut v = s;
            for &(f, divide) in t.factors.iter().rev() {
                let op = if divide { BinaryOp::Div } else { BinaryOp::Mul };
                v = push(&mut body, Inst::binary(op, v, map[f]));
            }
            acc = Some(match acc {
                None if t.negative => push(&mut body, Inst::unary(UnaryOp::Neg, v)),
                None => v,
                Some(a) => {
                    let op = if t.negative {
                        BinaryOp::Sub
                    } else {
                        BinaryOp::Add
                    };
                    push(&mut body, Inst::binary(op, a, v))
                }
            });
        }
        // A plan has at least one term (an operand that is not row-level has one).
        map[i] = acc.unwrap_or(usize::MAX);
    }
    FusedKernel {
        domain: k.domain.clone(),
        reduce_axes: k.reduce_axes.clone(),
        inputs: k.inputs.clone(),
        body,
        outputs: (k.outputs.iter())
            .map(|o| Output {
                value: map[o.value],
            })
            .collect(),
    }
}
