//! Matrix products whose output rows have an odd length, padded to the tensor cores' alignment.
//!
//! cuBLAS runs its tensor-core kernels only on operands whose rows start on 16-byte boundaries:
//! a leading dimension that is a multiple of 8 bf16 (or 4 f32) elements. A language model's
//! head over transformers' GPT-2 vocabulary (50,257 tokens) has none: the logits `[rows, 50257]`
//! and their gradient are the output of one product and an operand of the two in the backward
//! pass, and all three fall back to slower kernels (gpt2's step on the H200, bf16: 34.98 ms at
//! 50,257 against 19.92 ms at 50,304).
//!
//! The pass pads the forward graph, before autodiff, so the backward pass is built on the
//! padded product and every one of its three GEMMs is aligned:
//!
//! ```text
//! y = a · b            [.., m, n]      rows of n elements not on 16-byte boundaries
//! =>
//! b' = concat(b, 0)    n rounded up to a multiple of `align` along b's output axis
//! y  = slice(a · b', last axis, 0..n)
//! ```
//!
//! The extra columns are products with zeros, never read: `y` is the same value (each element
//! is the same sum over the same terms), and its gradient `dy` reaches `b` as `dy` padded with
//! zero columns, which adds only zero terms to `a`'s gradient. The slice is a view that fusion
//! reads through; the pad of `dy` is one copy of it, and the pad of `b` a copy of the weight.
//! Small outputs (a classifier's ten classes) are left alone: their GEMMs are launch-bound.

use crate::error::IrError;
use crate::ir::{CmpOp, DType, Graph, NodeId, Op, Shape};
use std::collections::HashMap;

/// Products with an output row shorter than this are not padded.
pub const MIN_COLUMNS: usize = 256;

/// The boundary, in bytes, that cuBLAS's tensor-core kernels want every row to start on.
pub const ROW_BYTES: usize = 16;

/// `g` with every matrix product whose output rows are at least [`MIN_COLUMNS`] long and not a
/// multiple of [`ROW_BYTES`] padded to a multiple of `align` elements, as the module says, and
/// how many were. (A row already aligned, such as an ImageNet classifier's 1,000 classes, is
/// left alone: padding it would only copy.)
pub fn pad_matmuls(g: &Graph, align: usize) -> Result<(Graph, usize), IrError> {
    if align < 2 || !g.ids().any(|id| padded_columns(g, id, align).is_some()) {
        return Ok((g.clone(), 0));
    }
    let mut count = 0;
    // The pad and the slice belong to the product (`rebuild` keeps each node's origin).
    let out = g.rebuild(|out, map, id| {
        let n = g.node(id);
        let (&Op::MatMul { ta, tb }, Some(to)) = (&n.op, padded_columns(g, id, align)) else {
            return Ok(None);
        };
        count += 1;
        let b = map[n.inputs[1].index()];
        let bdims = out.ty(b).shape.dims().to_vec();
        // b's axis that becomes the output's columns: its last, or the one before when b is
        // read transposed.
        let axis = bdims.len() - if tb { 2 } else { 1 };
        let mut zdims = bdims.clone();
        zdims[axis] = to - bdims[axis];
        let zeros = out.full(0.0, Shape(zdims.into()), out.ty(b).dtype)?;
        let wide = out.concat(&[b, zeros], axis)?;
        let a = map[n.inputs[0].index()];
        let y = out.push(Op::MatMul { ta, tb }, &[a, wide], None)?;
        let last = n.ty.shape.dims().len() - 1;
        Ok(Some(out.slice(y, last, 0, n.ty.shape.dims()[last])?))
    })?;
    Ok((out, count))
}

/// After autodiff, `g` with each zero-padded concat of an elementwise value computed on the
/// padded width instead, and how many were.
///
/// The padded product's gradient is `concat(dy, 0)`: as a library call it is a copy of the
/// logits' gradient, and both are live at once (786 MiB each for gpt2's head in bf16). But `dy`
/// is elementwise in values that are themselves views of wider ones (the logits, a slice of the
/// padded product), row statistics broadcast along the row, an `iota` (the labels' one-hot) and
/// constants, so the same expression evaluated over the padded width reads nothing out of
/// bounds, and
///
/// ```text
/// concat(dy, full(c)) => select(iota < n, dy widened, full(c))
/// ```
///
/// is one kernel that fusion writes straight into the padded buffer. What `dy` computes in the
/// extra columns is discarded by the select. A concat whose first part reaches anything else
/// (a reduction along the axis, a library call, a reshape) stays as it is.
pub fn widen_padded_concats(g: &Graph) -> Result<(Graph, usize), IrError> {
    let padded = |id: NodeId| -> Option<(usize, f64)> {
        let n = g.node(id);
        let Op::Concat { axis } = n.op else {
            return None;
        };
        let [x, z] = n.inputs[..] else {
            return None;
        };
        let Op::Full { value } = g.node(z).op else {
            return None;
        };
        let to = n.ty.shape.dims()[axis];
        (g.ty(x).dtype.is_float() && widens(g, x, axis, to, &mut HashMap::new()))
            .then_some((axis, value))
    };
    let found: Vec<(NodeId, usize, f64)> = g
        .ids()
        .filter_map(|id| padded(id).map(|(a, v)| (id, a, v)))
        .collect();
    if found.is_empty() {
        return Ok((g.clone(), 0));
    }
    let mut at = found.iter().peekable();
    let out = g.rebuild(|out, map, id| {
        let Some(&(_, axis, value)) = at.next_if(|&&(c, ..)| c == id) else {
            return Ok(None);
        };
        let n = g.node(id);
        let x = n.inputs[0];
        let shape = n.ty.shape.clone();
        let mut memo = HashMap::new();
        let wide = widen(g, out, map, x, axis, &shape, &mut memo)?;
        let index = out.iota(shape.clone(), axis, DType::I32)?;
        let n_cols = g.ty(x).shape.dims()[axis];
        let bound = out.full(n_cols as f64, shape.clone(), DType::I32)?;
        let inside = out.compare(CmpOp::Lt, index, bound)?;
        let fill = out.full(value, shape, n.ty.dtype)?;
        Ok(Some(out.select(inside, wide, fill)?))
    })?;
    Ok((out.without_dead_code().0, found.len()))
}

/// Whether `x`'s value can be computed with `axis` `to` long by [`widen`].
fn widens(g: &Graph, x: NodeId, axis: usize, to: usize, memo: &mut HashMap<NodeId, bool>) -> bool {
    if let Some(&w) = memo.get(&x) {
        return w;
    }
    let n = g.node(x);
    let len = n.ty.shape.dims()[axis];
    let w = match &n.op {
        Op::Full { .. } | Op::Iota { .. } => true,
        // A view of the first columns of a value wide enough.
        Op::Slice {
            axis: a, start: 0, ..
        } if *a == axis => g.ty(n.inputs[0]).shape.dims()[axis] >= to,
        // Broadcast along the axis (row statistics), or of a value that widens itself.
        Op::Broadcast => {
            let from = g.ty(n.inputs[0]).shape.dims();
            from.len() == n.ty.shape.dims().len()
                && (from[axis] == 1 || widens(g, n.inputs[0], axis, to, memo))
        }
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert => n
            .inputs
            .iter()
            .all(|&i| g.ty(i).shape.dims().get(axis) == Some(&len) && widens(g, i, axis, to, memo)),
        _ => false,
    };
    memo.insert(x, w);
    w
}

/// `x`'s expression (checked by [`widens`]) built in `out` over `shape`, which is `x`'s shape
/// with `axis` wider: slices read further into their operand, broadcasts and constants are
/// made wider, elementwise ops are applied to their widened operands.
fn widen(
    g: &Graph,
    out: &mut Graph,
    new_id: &[NodeId],
    x: NodeId,
    axis: usize,
    shape: &Shape,
    memo: &mut HashMap<NodeId, NodeId>,
) -> Result<NodeId, IrError> {
    if let Some(&w) = memo.get(&x) {
        return Ok(w);
    }
    let n = g.node(x);
    let to = shape.dims()[axis];
    let w = match &n.op {
        Op::Full { value } => out.full(*value, shape.clone(), n.ty.dtype)?,
        Op::Iota { axis: a } => out.iota(shape.clone(), *a, n.ty.dtype)?,
        Op::Slice { .. } => {
            // `widens` checked that the operand is at least `to` long.
            let from = new_id[n.inputs[0].index()];
            if out.ty(from).shape.dims()[axis] == to {
                from
            } else {
                out.slice(from, axis, 0, to)?
            }
        }
        Op::Broadcast => {
            let src = n.inputs[0];
            let from = if g.ty(src).shape.dims()[axis] == 1 {
                new_id[src.index()]
            } else {
                let mut s = g.ty(src).shape.clone();
                s.0[axis] = to;
                widen(g, out, new_id, src, axis, &s, memo)?
            };
            out.broadcast_to(from, shape.clone())?
        }
        _ => {
            let mut ins = Vec::with_capacity(n.inputs.len());
            for &i in &n.inputs {
                ins.push(widen(g, out, new_id, i, axis, shape, memo)?);
            }
            let mut ty = n.ty.clone();
            ty.shape = shape.clone();
            out.push(n.op.clone(), &ins, Some(ty))?
        }
    };
    memo.insert(x, w);
    Ok(w)
}

/// The padded row length of product `id`, when the pass pads it.
fn padded_columns(g: &Graph, id: NodeId, align: usize) -> Option<usize> {
    let n = g.node(id);
    if !matches!(n.op, Op::MatMul { .. }) || !n.ty.dtype.is_float() {
        return None;
    }
    let cols = *n.ty.shape.dims().last()?;
    let misaligned = !(cols * n.ty.dtype.size()).is_multiple_of(ROW_BYTES);
    (cols >= MIN_COLUMNS && misaligned).then(|| cols.div_ceil(align) * align)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{CmpOp, DType, Init};

    fn head(vocab: usize) -> (Graph, NodeId) {
        let mut g = Graph::new();
        let x = g.input("x", [6, 16], DType::F32).unwrap();
        let w = g
            .parameter("w", [vocab, 16], DType::F32, Init::Zeros)
            .unwrap();
        let y = g.matmul_t(x, w, false, true).unwrap();
        g.set_output("y", y).unwrap();
        (g, y)
    }

    #[test]
    fn an_odd_vocabulary_head_is_computed_on_an_aligned_product_and_sliced_back() {
        let (g, _) = head(1001);
        let (p, count) = pad_matmuls(&g, 64).unwrap();
        assert_eq!(count, 1);
        let y = p.outputs["y"];
        assert_eq!(
            p.ty(y).shape.dims(),
            &[6, 1001],
            "the value keeps its shape"
        );
        assert!(matches!(
            p.node(y).op,
            Op::Slice {
                axis: 1,
                start: 0,
                end: 1001
            }
        ));
        let mm = p.node(y).inputs[0];
        assert!(matches!(
            p.node(mm).op,
            Op::MatMul {
                ta: false,
                tb: true
            }
        ));
        assert_eq!(p.ty(mm).shape.dims(), &[6, 1024]);
        let wide = p.node(mm).inputs[1];
        assert!(matches!(p.node(wide).op, Op::Concat { axis: 0 }));
        assert_eq!(p.ty(wide).shape.dims(), &[1024, 16]);
    }

    /// A softmax-like gradient of the first 301 columns of a `[4, 320]` value, zero-padded.
    fn padded_gradient(narrow_operand: bool) -> Graph {
        let mut g = Graph::new();
        let wide = g.input("logits", [4, 320], DType::F32).unwrap();
        let labels = g.input("labels", [4, 1], DType::I32).unwrap();
        let y = g.slice(wide, 1, 0, 301).unwrap();
        let m = g.max(y, &[1]).unwrap();
        let mb = g.broadcast_to(m, [4, 301]).unwrap();
        let mut e = g.sub(y, mb).unwrap();
        e = g.exp(e).unwrap();
        // Normalised by its row's sum: a row statistic of the narrow value, broadcast.
        let s = g.sum(e, &[1]).unwrap();
        let s = g.broadcast_to(s, [4, 301]).unwrap();
        e = g.div(e, s).unwrap();
        if narrow_operand {
            // A value only 301 columns wide (a leaf): nothing to read past them.
            let w = g.input("weights", [4, 301], DType::F32).unwrap();
            e = g.mul(e, w).unwrap();
        }
        let iota = g.iota([4, 301], 1, DType::I32).unwrap();
        let lb = g.broadcast_to(labels, [4, 301]).unwrap();
        let hit = g.compare(CmpOp::Eq, iota, lb).unwrap();
        let one = g.full(1.0, [4, 301], DType::F32).unwrap();
        let oh = g.select(hit, one, e).unwrap();
        let dy = g.sub(e, oh).unwrap();
        let z = g.full(0.0, [4, 19], DType::F32).unwrap();
        let c = g.concat(&[dy, z], 1).unwrap();
        g.set_output("grad", c).unwrap();
        g
    }

    #[test]
    fn a_zero_padded_elementwise_gradient_is_computed_on_the_padded_width_and_masked() {
        let g = padded_gradient(false);
        let (w, count) = widen_padded_concats(&g).unwrap();
        assert_eq!(count, 1);
        assert!(!w.ids().any(|id| matches!(w.node(id).op, Op::Concat { .. })));
        let out = w.outputs["grad"];
        assert!(matches!(w.node(out).op, Op::Select));
        assert_eq!(w.ty(out).shape.dims(), &[4, 320]);
        // The widened expression reads the logits whole, not their first 301 columns.
        let logits = w.leaf("logits").unwrap();
        assert!(w.ids().any(
            |id| matches!(w.node(id).op, Op::Unary(crate::ir::UnaryOp::Exp))
                && w.ty(id).shape.dims() == [4, 320]
        ));
        assert!(w
            .ids()
            .any(|id| w.node(id).inputs.contains(&logits) && w.ty(id).shape.dims() == [4, 320]));
    }

    #[test]
    fn a_padded_value_of_an_operand_as_narrow_as_itself_stays_a_concat() {
        let g = padded_gradient(true);
        let (w, count) = widen_padded_concats(&g).unwrap();
        assert_eq!(count, 0);
        assert_eq!(w.len(), g.len());
    }

    #[test]
    fn aligned_and_small_products_are_left_as_they_are() {
        for vocab in [1024, 1000, 10, 255] {
            let (g, _) = head(vocab);
            let (p, count) = pad_matmuls(&g, 64).unwrap();
            assert_eq!(count, 0, "vocab {vocab}");
            assert_eq!(p.len(), g.len());
        }
    }
}
