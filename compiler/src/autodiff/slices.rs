//! The gradient of a value read through several slices along one axis, joined by segment.
//!
//! A slice's VJP alone is its gradient padded with zeros to the operand's shape, a concat of
//! unequal parts and so a library call whose result reaches memory at the operand's full size.
//! A value read by several slices (a linear resize's neighbours, `x` shifted by one either way
//! with its edge repeated: four slices of `x`, read beside `x` itself) then gets one full-size
//! padded buffer per slice, all live until their sum, which is what made the imported U-Net's
//! bilinear Resize's backward its peak without workspaces (issue 46).
//!
//! Joined instead: the axis is cut at every slice's bounds, each segment's gradient is the sum
//! of the contributions that cover it (views of them, which fusion reads in place), and the
//! segments are joined by one concat. No zeros are written where a contribution covers them,
//! and no contribution is materialized at the operand's size. Each segment sums its terms in
//! the order they arrived, as the padded sum did, so the values are the same (a padding zero
//! adds nothing).

use crate::error::Result;
use crate::ir::{Graph, NodeId, Op, Shape};
use std::collections::BTreeSet;

/// One contribution to a value's gradient, in the order the backward walk made it.
pub(super) enum Part {
    /// A gradient of the value's own shape.
    Dense(NodeId),
    /// The gradient of `slice(x, axis, start, end)`: it covers only that range of the axis.
    Slice {
        axis: usize,
        start: usize,
        end: usize,
        gy: NodeId,
    },
}

/// Which nodes (up to `loss`) get their gradient joined by segment: a node read by a slice and
/// by at least one more operand slot (`users`). A node read by one slice alone keeps the
/// slice's padded VJP, which is the same thing made at once.
pub(super) fn joined(g: &Graph, loss: NodeId, users: &[usize]) -> Vec<bool> {
    let mut sliced = vec![false; loss.index() + 1];
    for i in 0..=loss.index() {
        let n = g.node(NodeId(i as u32));
        if let Op::Slice { .. } = n.op {
            sliced[n.inputs[0].index()] = true;
        }
    }
    sliced
        .iter()
        .zip(users)
        .map(|(&s, &u)| s && u >= 2)
        .collect()
}

/// The gradient of a value shaped `xs` from its contributions `parts` (at least one): their
/// sum, with the slices along the first slice's axis joined by segment (slices along another
/// axis are padded, as their own VJP pads them).
pub(super) fn join(g: &mut Graph, xs: &Shape, parts: Vec<Part>) -> Result<NodeId> {
    let axis = parts.iter().find_map(|p| match p {
        Part::Slice { axis, .. } => Some(*axis),
        Part::Dense(_) => None,
    });
    // Every part as a dense gradient or a slice along `axis`.
    let mut terms = Vec::with_capacity(parts.len());
    for p in parts {
        terms.push(match p {
            Part::Slice {
                axis: a,
                start,
                end,
                gy,
            } if Some(a) != axis => Part::Dense(slice_vjp(g, xs, a, start, end, gy)?),
            p => p,
        });
    }
    let Some(axis) = axis else {
        return sum(
            g,
            terms.iter().map(|p| match p {
                Part::Dense(d) => *d,
                Part::Slice { .. } => unreachable!("no slice without an axis"),
            }),
        );
    };
    let size = xs.dims()[axis];
    let mut cuts = BTreeSet::from([0, size]);
    for p in &terms {
        if let Part::Slice { start, end, .. } = p {
            cuts.insert(*start);
            cuts.insert(*end);
        }
    }
    let cuts: Vec<usize> = cuts.into_iter().collect();
    let dtype = match terms[0] {
        Part::Dense(d) | Part::Slice { gy: d, .. } => g.ty(d).dtype,
    };
    let mut segments = Vec::with_capacity(cuts.len() - 1);
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let mut covering = Vec::new();
        for p in &terms {
            covering.push(match *p {
                Part::Dense(d) => view(g, d, axis, a, b, size)?,
                Part::Slice { start, end, gy, .. } if start <= a && b <= end => {
                    view(g, gy, axis, a - start, b - start, end - start)?
                }
                Part::Slice { .. } => continue,
            });
        }
        segments.push(if covering.is_empty() {
            let mut dims = xs.dims().to_vec();
            dims[axis] = b - a;
            g.full(0.0, Shape::new(&dims), dtype)?
        } else {
            sum(g, covering.into_iter())?
        });
    }
    match segments.as_slice() {
        [one] => Ok(*one),
        _ => g.concat(&segments, axis),
    }
}

/// The VJP of `slice(x, axis, start, end)` for `x` shaped `xs`: `gy` padded with zeros back
/// to `xs` along `axis`.
pub(super) fn slice_vjp(
    g: &mut Graph,
    xs: &Shape,
    axis: usize,
    start: usize,
    end: usize,
    gy: NodeId,
) -> Result<NodeId> {
    let dt = g.ty(gy).dtype;
    let zeros = |g: &mut Graph, len: usize| -> Result<Option<NodeId>> {
        if len == 0 {
            return Ok(None);
        }
        let mut dims = xs.0.clone();
        dims[axis] = len;
        g.full(0.0, Shape(dims), dt).map(Some)
    };
    let before = zeros(g, start)?;
    let after = zeros(g, xs.dims()[axis] - end)?;
    let parts: Vec<NodeId> = before.into_iter().chain([gy]).chain(after).collect();
    if parts.len() == 1 {
        Ok(gy)
    } else {
        g.concat(&parts, axis)
    }
}

/// `x[a..b]` along `axis` (of size `size`): `x` itself when that is all of it.
fn view(g: &mut Graph, x: NodeId, axis: usize, a: usize, b: usize, size: usize) -> Result<NodeId> {
    if a == 0 && b == size {
        Ok(x)
    } else {
        g.slice(x, axis, a, b)
    }
}

/// The terms added left to right, as the backward walk adds contributions.
fn sum(g: &mut Graph, mut terms: impl Iterator<Item = NodeId>) -> Result<NodeId> {
    let first = terms
        .next()
        .expect("a gradient has at least one contribution");
    terms.try_fold(first, |acc, t| g.add(acc, t))
}

#[cfg(test)]
mod tests {
    use crate::ir::{DType, Graph, Init, NodeId, Op};

    /// `x` (`[3, 8]`) read beside a linear resize's neighbours along axis 1 (four slices, two
    /// concats), the loss their weighted sum; the gradient of `x` and the number of concats the
    /// backward pass writes at `x`'s full size.
    fn neighbours() -> (Graph, NodeId, NodeId, usize) {
        let mut g = Graph::new();
        let x = g.parameter("x", [3, 8], DType::F32, Init::Zeros).unwrap();
        let tail = g.slice(x, 1, 1, 8).unwrap();
        let last = g.slice(x, 1, 7, 8).unwrap();
        let head = g.slice(x, 1, 0, 7).unwrap();
        let first = g.slice(x, 1, 0, 1).unwrap();
        let next = g.concat(&[tail, last], 1).unwrap();
        let prev = g.concat(&[first, head], 1).unwrap();
        let b = g.mul_scalar(next, 0.25).unwrap();
        let c = g.mul_scalar(prev, 0.5).unwrap();
        let y = g.add(x, b).unwrap();
        let y = g.add(y, c).unwrap();
        let loss = g.sum(y, &[0, 1]).unwrap();
        let loss = g.reshape(loss, crate::ir::Shape::scalar()).unwrap();
        let before = g.len();
        let gx = crate::autodiff::grad(&mut g, loss, &[x]).unwrap()[0];
        let full = (before..g.len())
            .map(|i| g.node(NodeId(i as u32)))
            .filter(|n| matches!(n.op, Op::Concat { .. }) && n.ty.shape.dims() == [3, 8])
            .count();
        (g, x, gx, full)
    }

    #[test]
    fn a_value_read_through_four_slices_gets_one_full_size_concat_not_one_per_slice() {
        let (g, x, gx, full) = neighbours();
        assert_eq!(g.ty(gx), g.ty(x));
        // Cut at 0, 1, 7 and 8: three segment sums joined once (the padded VJPs wrote four).
        assert_eq!(full, 1);
        let Op::Concat { axis: 1 } = g.node(gx).op else {
            panic!(
                "the gradient is {:?}, not a concat along axis 1",
                g.node(gx).op
            );
        };
        let widths: Vec<usize> = g
            .node(gx)
            .inputs
            .iter()
            .map(|&s| g.ty(s).shape.dims()[1])
            .collect();
        assert_eq!(widths, [1, 6, 1]);
    }
}
