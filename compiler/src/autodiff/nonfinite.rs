//! The step checks its own update: a count of the non-finite values among the parameters it
//! writes, output beside the loss as [`NONFINITE`].
//!
//! A finite loss does not make finite weights: the update after it can overflow (a learning
//! rate too large) or divide by zero (the gradient of `sqrt` at 0). Without a check inside the
//! step the run only learns of it when it reads the weights (to save them), steps later. The
//! count is a reduction over each new parameter value, appended after the update so that
//! fusion folds its first stage (a sum per row, `count_by_rows`) into the update's own
//! kernel (the value is in registers there: no extra pass over the weights). The host reads
//! it with the loss each step; a nonzero count stops the run, and only then does the host
//! look for which parameter it was.
//!
//! An element `x` is non-finite exactly when `x - x` is not 0 (`inf - inf` and `NaN - NaN`
//! are NaN; every finite `x` gives 0), so the count is `Σ select(x - x ≠ 0, 1, 0)`: each
//! parameter's count summed in f32 (exact to 2^24, and never back to 0 once above it), the
//! parameters' counts added in f64. No rewrite rule folds `x - x`, for this reason.

use super::phase::Phases;
use crate::error::Result;
use crate::ir::{CmpOp, DType, Graph, LeafKind, Op, Origin, Shape};

/// The name of the f64 scalar output counting the non-finite values of the parameters the
/// step has just written ([`super::StepOptions::count_nonfinite`]).
pub const NONFINITE: &str = "nonfinite_parameters";

/// Elements a row of the first stage of `count_by_rows` holds at least, where the
/// parameter has the axes for it: a row kernel's threads stride along a row.
const MIN_ROW: usize = 256;

/// The sum of `ones` in two reductions: over its trailing axes first (the last, and more
/// before it while a row holds fewer than [`MIN_ROW`] elements, keeping the first axis), a sum
/// per row that fusion folds into the update's own kernel (which then runs a block or a few
/// lanes per row, as a LayerNorm does, writing the new parameter as before), then over the
/// rows in a small kernel of its own. One reduction over every element at once would give the
/// update's kernel one row the length of the whole parameter: one block of the GPU for GPT-2's
/// 38 M embedding weights. A convolution's `[64, 64, 3, 3]` weight is 64 rows of 576, GPT-2's
/// embedding 50,257 rows of 768.
fn count_by_rows(g: &mut Graph, ones: crate::ir::NodeId) -> Result<crate::ir::NodeId> {
    let dims = g.ty(ones).shape.dims().to_vec();
    if dims.is_empty() {
        return Ok(ones);
    }
    let mut first = dims.len() - 1;
    while first > 1 && dims[first..].iter().product::<usize>() < MIN_ROW {
        first -= 1;
    }
    let axes: Vec<usize> = (first..dims.len()).collect();
    let rows = g.sum(ones, &axes)?;
    g.sum_all(rows)
}

/// Appends the count of non-finite values over every updated parameter's new value to `g` as
/// the output [`NONFINITE`], in the optimizer phase. A step that updates no parameter (none
/// reach the loss) is returned as it is.
pub fn count_nonfinite(mut g: Graph, phases: Phases) -> Result<(Graph, Phases)> {
    let updated: Vec<_> = g
        .updates
        .iter()
        .filter(|u| {
            matches!(
                g.node(u.target).op,
                Op::Leaf {
                    kind: LeafKind::Parameter,
                    ..
                }
            )
        })
        .map(|u| (u.target, u.value))
        .collect();
    if updated.is_empty() {
        return Ok((g, phases));
    }
    let mut total = None;
    for (target, value) in updated {
        let from = g.len();
        let dtype = g.ty(value).dtype;
        let d = g.sub(value, value)?;
        let zero = g.full(0.0, Shape::scalar(), dtype)?;
        let bad = g.compare(CmpOp::Ne, d, zero)?;
        let one = g.full(1.0, Shape::scalar(), DType::F32)?;
        let none = g.full(0.0, Shape::scalar(), DType::F32)?;
        let ones = g.select(bad, one, none)?;
        let count = count_by_rows(&mut g, ones)?;
        let count = g.convert(count, DType::F64)?;
        let origin = Origin::new(&format!(
            "update of {}",
            g.leaf_name(target).unwrap_or("a parameter")
        ));
        for i in from..g.len() {
            g.set_origin(crate::ir::NodeId(i as u32), origin.clone());
        }
        total = Some(match total {
            None => count,
            Some(t) => {
                let s = g.add(t, count)?;
                g.set_origin(s, Origin::new("non-finite check"));
                s
            }
        });
    }
    let total = total.expect("at least one parameter is updated");
    g.set_output(NONFINITE, total)?;
    let optimizer = phases.optimizer.start..g.len();
    Ok((
        g,
        Phases {
            optimizer,
            ..phases
        },
    ))
}
