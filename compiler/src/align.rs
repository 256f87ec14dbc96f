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
use crate::ir::{Graph, NodeId, Op, Shape};

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
    let mut out = Graph::new();
    let mut new_id: Vec<NodeId> = Vec::with_capacity(g.len());
    let mut count = 0;
    for id in g.ids() {
        let n = g.node(id);
        out.set_scope(g.origin(id).clone()); // the pad and the slice belong to the product
        let ins: Vec<NodeId> = n.inputs.iter().map(|x| new_id[x.index()]).collect();
        let mapped = match (&n.op, padded_columns(g, id, align)) {
            (&Op::MatMul { ta, tb }, Some(to)) => {
                count += 1;
                let b = ins[1];
                let bdims = out.ty(b).shape.dims().to_vec();
                // b's axis that becomes the output's columns: its last, or the one before when
                // b is read transposed.
                let axis = bdims.len() - if tb { 2 } else { 1 };
                let mut zdims = bdims.clone();
                zdims[axis] = to - bdims[axis];
                let zeros = out.full(0.0, Shape(zdims.into()), out.ty(b).dtype)?;
                let wide = out.concat(&[b, zeros], axis)?;
                let y = out.push(Op::MatMul { ta, tb }, &[ins[0], wide], None)?;
                let last = n.ty.shape.dims().len() - 1;
                out.slice(y, last, 0, n.ty.shape.dims()[last])?
            }
            _ => out.push(n.op.clone(), &ins, Some(n.ty.clone()))?,
        };
        new_id.push(mapped);
    }
    out.keep_outputs_of(g, |x| new_id[x.index()])?;
    Ok((out, count))
}

/// The padded row length of product `id`, when the pass pads it.
fn padded_columns(g: &Graph, id: NodeId, align: usize) -> Option<usize> {
    let n = g.node(id);
    if !matches!(n.op, Op::MatMul { .. }) || !n.ty.dtype.is_float() {
        return None;
    }
    let cols = *n.ty.shape.dims().last()?;
    let misaligned = cols * n.ty.dtype.size() % ROW_BYTES != 0;
    (cols >= MIN_COLUMNS && misaligned).then(|| cols.div_ceil(align) * align)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, Init};

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
