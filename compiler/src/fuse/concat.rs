//! Concats of equal parts become selects, so that fusion can see through them.
//!
//! A concat is a library call: its parts must be buffers, so a part that is a view (the
//! gradients of q, k and v, transposed back from the heads' layout before they are joined)
//! costs a kernel of its own and a round trip through memory. Joining `n` parts of size `s`
//! along an axis is, on the output viewed with that axis split as `[n, s]`, a choice by the
//! index along the new axis of size `n`:
//!
//! ```text
//! out[.., p, j, ..] = select(p == 0, x0[.., j, ..], select(p == 1, x1[.., j, ..], x2[.., j, ..]))
//! ```
//!
//! which is made of elementwise ops and views that fusion expands into one kernel. Each part is
//! read only where its branch is taken (the CUDA generator's guarded loads), so the kernel moves
//! the bytes the concat moved, and the parts' views cost nothing.
//!
//! A part's axis is split further when every part is a reshape of a value that splits it the
//! same way (the heads' `[12, 64]` behind a `768`): fusion's index maps follow a reshape that
//! merges axes but not one that splits them, so the select is built on the finer shape.
//! Concats of unequal parts stay library calls.

use crate::error::IrError;
use crate::ir::{CmpOp, DType, Graph, NodeId, Op, Shape};

/// The graph with every concat of equal parts written as selects, and how many were.
pub fn as_selects(g: &Graph) -> Result<(Graph, usize), IrError> {
    if !g
        .ids()
        .any(|id| equal_parts(g, id).is_some_and(|parts| parts > 1))
    {
        return Ok((g.clone(), 0));
    }
    let mut count = 0;
    // The selects keep the concat's origin (`rebuild` keeps each node's).
    let out = g.rebuild(|out, map, id| {
        let n = g.node(id);
        let (&Op::Concat { axis }, Some(parts)) = (&n.op, equal_parts(g, id)) else {
            return Ok(None);
        };
        if parts <= 1 {
            return Ok(None);
        }
        count += 1;
        let split = finer_split(g, &n.inputs, axis);
        // A part's own value: the reshape's operand where the split comes from it.
        let sources: Vec<NodeId> = n
            .inputs
            .iter()
            .map(|&x| match &split {
                Split::Through(_) => map[g.node(x).inputs[0].index()],
                Split::Plain(_) => map[x.index()],
            })
            .collect();
        select_chain(out, &sources, &n.ty.shape, axis, split.dims()).map(Some)
    })?;
    // The reshapes whose operands the selects read directly are dead now.
    Ok((out.without_dead_code().0, count))
}

/// The number of parts of a concat whose parts are all the same size along its axis.
fn equal_parts(g: &Graph, id: NodeId) -> Option<usize> {
    let n = g.node(id);
    let Op::Concat { axis } = n.op else {
        return None;
    };
    let size = g.ty(n.inputs[0]).shape.dims()[axis];
    n.inputs
        .iter()
        .all(|&x| g.ty(x).shape.dims()[axis] == size && size > 0)
        .then_some(n.inputs.len())
}

/// How the concat axis of each part is laid out in the select.
enum Split {
    /// As itself: one axis of the part's size.
    Plain(Vec<usize>),
    /// As the axes of the value every part reshapes (same prefix and suffix, the part's axis
    /// split into these).
    Through(Vec<usize>),
}

impl Split {
    fn dims(&self) -> &[usize] {
        match self {
            Split::Plain(d) | Split::Through(d) => d,
        }
    }
}

/// The finest split of the concat axis that every part's producer agrees on.
fn finer_split(g: &Graph, parts: &[NodeId], axis: usize) -> Split {
    let dims = g.ty(parts[0]).shape.dims();
    let plain = Split::Plain(vec![dims[axis]]);
    let split_of = |x: NodeId| -> Option<Vec<usize>> {
        let n = g.node(x);
        if n.op != Op::Reshape {
            return None;
        }
        let part = g.ty(x).shape.dims();
        let src = g.ty(n.inputs[0]).shape.dims();
        let (pre, post) = (&part[..axis], &part[axis + 1..]);
        if src.len() < pre.len() + post.len() + 2
            || &src[..pre.len()] != pre
            || &src[src.len() - post.len()..] != post
        {
            return None;
        }
        let mid = src[pre.len()..src.len() - post.len()].to_vec();
        (mid.iter().product::<usize>() == part[axis]).then_some(mid)
    };
    let Some(first) = split_of(parts[0]) else {
        return plain;
    };
    if parts.iter().all(|&x| split_of(x).as_ref() == Some(&first)) {
        Split::Through(first)
    } else {
        plain
    }
}

/// `select(p == 0, x0, select(p == 1, x1, .. x_{n-1}))` over the concat's shape with `axis`
/// split into `[n, mid..]`, reshaped back to `shape`. `sources` are shaped
/// `pre ++ mid ++ post`.
fn select_chain(
    g: &mut Graph,
    sources: &[NodeId],
    shape: &Shape,
    axis: usize,
    mid: &[usize],
) -> Result<NodeId, IrError> {
    let dims = shape.dims();
    let part_shape = |n: usize| -> Vec<usize> {
        let mut s = dims[..axis].to_vec();
        s.push(n);
        s.extend_from_slice(mid);
        s.extend_from_slice(&dims[axis + 1..]);
        s
    };
    let wide = Shape::from(&part_shape(sources.len())[..]);
    let index = g.iota(wide.clone(), axis, DType::I32)?;
    let mut parts = Vec::with_capacity(sources.len());
    for &x in sources {
        let one = g.reshape(x, &part_shape(1)[..])?;
        parts.push(g.broadcast_to(one, wide.clone())?);
    }
    let mut acc = *parts.last().expect("a concat has parts");
    for (p, &part) in parts.iter().enumerate().rev().skip(1) {
        let at = g.full(p as f64, wide.clone(), DType::I32)?;
        let here = g.compare(CmpOp::Eq, index, at)?;
        acc = g.select(here, part, acc)?;
    }
    g.reshape(acc, shape.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::TensorType;

    fn concat_of(parts: &[&[usize]], axis: usize) -> (Graph, NodeId) {
        let mut g = Graph::new();
        let xs: Vec<NodeId> = parts
            .iter()
            .enumerate()
            .map(|(i, s)| g.input(&format!("x{i}"), *s, DType::F32).unwrap())
            .collect();
        let c = g.concat(&xs, axis).unwrap();
        g.set_output("y", c).unwrap();
        (g, c)
    }

    #[test]
    fn a_concat_of_equal_parts_becomes_selects_and_no_concat_is_left() {
        let (g, _) = concat_of(&[&[2, 3], &[2, 3], &[2, 3]], 1);
        let (s, n) = as_selects(&g).unwrap();
        assert_eq!(n, 1);
        let h = s.op_histogram();
        assert_eq!(h.get("concat"), None, "{s}");
        assert_eq!(h.get("select"), Some(&2), "{s}");
        assert_eq!(
            s.ty(s.outputs["y"]),
            &TensorType::new(&[2usize, 9][..], DType::F32)
        );
    }

    #[test]
    fn a_concat_of_unequal_parts_stays() {
        let (g, _) = concat_of(&[&[2, 3], &[2, 4]], 1);
        let (s, n) = as_selects(&g).unwrap();
        assert_eq!(n, 0);
        assert_eq!(s.op_histogram().get("concat"), Some(&1));
    }

    #[test]
    fn parts_that_reshape_a_split_axis_are_read_on_the_split_shape() {
        // Three [2, 3, 4] heads' values, each reshaped to [2, 12], joined into [2, 36].
        let mut g = Graph::new();
        let mut parts = Vec::new();
        for i in 0..3 {
            let x = g
                .input(&format!("x{i}"), &[2usize, 3, 4][..], DType::F32)
                .unwrap();
            let t = g.transpose(x, &[0, 2, 1]).unwrap();
            let t = g.transpose(t, &[0, 2, 1]).unwrap();
            parts.push(g.reshape(t, &[2usize, 12][..]).unwrap());
        }
        let c = g.concat(&parts, 1).unwrap();
        g.set_output("y", c).unwrap();
        let (s, n) = as_selects(&g).unwrap();
        assert_eq!(n, 1);
        let sel = s
            .ids()
            .filter(|&id| s.node(id).op == Op::Select)
            .last()
            .unwrap();
        assert_eq!(s.ty(sel).shape.dims(), &[2, 3, 3, 4]);
        // The [2, 12] reshapes the concat read are gone.
        assert!(!s
            .ids()
            .any(|id| s.node(id).op == Op::Reshape && s.ty(id).shape.dims() == [2, 12]));
    }
}
