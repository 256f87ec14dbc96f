//! A fused kernel cut into pieces along its outermost axis, so that threads can run the pieces
//! at once.
//!
//! A kernel whose outermost axis of size > 1 is kept (not reduced) computes every index of that
//! axis independently: an elementwise kernel computes each element alone, and a row kernel
//! (softmax, layer norm) folds each row alone. Slicing that axis into `[lo, hi)` ranges gives
//! kernels over disjoint parts of the domain whose outputs are disjoint, contiguous ranges of
//! the original outputs (outputs are stored row-major, and the sliced axis is the outermost
//! one). Each piece is an ordinary [`FusedKernel`]: its inputs are the original buffers with
//! the access offset moved by `lo` steps of the sliced axis, so every executor runs it as it
//! runs any kernel. A piece computes each of its elements exactly as the whole kernel does (the
//! order of every reduction's terms depends only on the row, never on which rows share a run),
//! so the pieces together give the whole kernel's bits, however many there are.
//!
//! A column reduction (the outermost axis of size > 1 reduced: a bias gradient summed over the
//! batch) is cut along its first kept axis instead, when every output is row-level (one value
//! per column): each piece sums its own columns, every column's terms in the order the whole
//! kernel adds them, and its outputs are a contiguous range of columns. A column reduction
//! with a full output (one value per element) is not cut: a range of columns is not a
//! contiguous range of it. Kernels that read [`Inst::Index`] of the sliced axis are not cut (a
//! piece would see indices from 0).

use super::{FusedKernel, Inst};

/// One piece of a kernel: the kernel over a slice of the domain, and where its outputs start
/// inside the original outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub kernel: FusedKernel,
    /// Per output: the element (not byte) of the original output this piece's output starts at.
    pub output_start: Vec<usize>,
}

/// The axis a kernel can be cut along: the first axis of size > 1 when it is kept; in a
/// column reduction (that axis reduced), the first kept axis of size > 1 when every output is
/// row-level; either only when no instruction reads the axis's index.
pub fn cut_axis(k: &FusedKernel) -> Option<usize> {
    let a = k.domain.iter().position(|&d| d > 1)?;
    let indexed = |a: usize| {
        k.body
            .iter()
            .any(|i| matches!(i, Inst::Index { axis, .. } if *axis == a))
    };
    if !k.reduce_axes.contains(&a) {
        return (!indexed(a)).then_some(a);
    }
    let c = (a + 1..k.domain.len()).find(|&d| k.domain[d] > 1 && !k.reduce_axes.contains(&d))?;
    let row = row_level(k);
    let per_column = k
        .outputs
        .iter()
        .all(|o| row.get(o.value).copied().unwrap_or(false));
    (per_column && !indexed(c)).then_some(c)
}

/// `k` cut into at most `pieces` pieces of nearly equal size along [`cut_axis`], each holding
/// at least `min_elems` domain elements (fewer pieces when the kernel is small); `None` when
/// the kernel cannot be cut or would make one piece only. The split depends only on the
/// kernel, `pieces` and `min_elems`, and the pieces' outputs tile the original outputs in order.
pub fn cut(k: &FusedKernel, pieces: usize, min_elems: usize) -> Option<Vec<Piece>> {
    let a = cut_axis(k)?;
    let size = k.domain[a];
    let numel = k.domain.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    let per_index = numel / size;
    let by_work = numel / min_elems.max(1);
    // A column reduction's piece keeps two columns at least: with one, it would be a
    // reduction along its innermost axis, which sums its terms in another order.
    let column = k.reduce_axes.iter().any(|&r| r < a && k.domain[r] > 1);
    let kept_after: usize = k
        .domain
        .iter()
        .enumerate()
        .filter(|(d, _)| *d > a && !k.reduce_axes.contains(d))
        .map(|(_, &x)| x)
        .product();
    let most = if column && kept_after == 1 {
        size / 2
    } else {
        size
    };
    let n = pieces.min(most).min(by_work);
    if n < 2 {
        return None;
    }
    // Elements of a full output, and of a row-level output, per index of the cut axis.
    let full_stride = per_index;
    let row_stride = k
        .domain
        .iter()
        .enumerate()
        .filter(|(d, _)| *d > a && !k.reduce_axes.contains(d))
        .map(|(_, &x)| x)
        .product::<usize>();
    let row_level = row_level(k);
    let mut out = Vec::with_capacity(n);
    for p in 0..n {
        let (lo, hi) = (size * p / n, size * (p + 1) / n);
        let mut piece = k.clone();
        piece.domain[a] = hi - lo;
        for inp in &mut piece.inputs {
            inp.access.offset += lo * inp.access.strides[a];
        }
        let output_start = k
            .outputs
            .iter()
            .map(|o| {
                lo * if row_level[o.value] {
                    row_stride
                } else {
                    full_stride
                }
            })
            .collect();
        out.push(Piece {
            kernel: piece,
            output_start,
        });
    }
    Some(out)
}

/// Whether each instruction is row-level (uniform along the reduce axes; see the
/// [module docs of the description](super)).
fn row_level(k: &FusedKernel) -> Vec<bool> {
    let mut row = Vec::with_capacity(k.body.len());
    for inst in &k.body {
        let r = match *inst {
            Inst::Load { input } => k.reduce_axes.iter().all(|&a| {
                k.inputs
                    .get(input)
                    .is_none_or(|i| i.access.strides.get(a).is_none_or(|&s| s == 0))
            }),
            Inst::Const { .. } => true,
            Inst::Index { axis, .. } => !k.reduce_axes.contains(&axis),
            Inst::Reduce { .. } => true,
            Inst::Unary { x, .. } | Inst::Convert { x, .. } => row.get(x).copied().unwrap_or(true),
            Inst::Binary { a, b, .. } | Inst::Compare { a, b, .. } => {
                row.get(a).copied().unwrap_or(true) && row.get(b).copied().unwrap_or(true)
            }
            Inst::Select { cond, a, b } => [cond, a, b]
                .iter()
                .all(|&x| row.get(x).copied().unwrap_or(true)),
        };
        row.push(r);
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::{Access, Input, Output};
    use crate::{DType, ReduceOp, UnaryOp};

    fn softmax(r: usize, n: usize) -> FusedKernel {
        FusedKernel {
            domain: vec![r, n],
            reduce_axes: vec![1],
            inputs: vec![Input {
                dtype: DType::F32,
                len: r * n,
                access: Access::contiguous(&[r, n]),
            }],
            body: vec![
                Inst::Load { input: 0 },
                Inst::Reduce {
                    op: ReduceOp::Max,
                    x: 0,
                },
                Inst::Unary {
                    op: UnaryOp::Exp,
                    x: 0,
                },
            ],
            outputs: vec![Output { value: 2 }, Output { value: 1 }],
        }
    }

    #[test]
    fn pieces_tile_the_cut_axis_and_the_outputs_in_order() {
        let k = softmax(10, 7);
        let pieces = cut(&k, 3, 1).expect("cut");
        assert_eq!(pieces.len(), 3);
        let sizes: Vec<usize> = pieces.iter().map(|p| p.kernel.domain[0]).collect();
        assert_eq!(sizes, [3, 3, 4]);
        let starts: Vec<usize> = pieces
            .iter()
            .map(|p| p.kernel.inputs[0].access.offset)
            .collect();
        assert_eq!(starts, [0, 21, 42]);
        // The full output advances 7 elements a row, the row-level one 1.
        assert_eq!(pieces[2].output_start, [42, 6]);
        for p in &pieces {
            p.kernel.check().expect("every piece is a valid kernel");
        }
    }

    #[test]
    fn a_column_reduction_is_cut_into_ranges_of_columns_unless_it_stores_a_full_value() {
        // softmax(10, 7) summed over its rows instead: 7 columns of 10 terms.
        let mut k = softmax(10, 7);
        k.reduce_axes = vec![0];
        k.outputs = vec![Output { value: 1 }];
        let pieces = cut(&k, 3, 1).expect("cut along the columns");
        let cols: Vec<usize> = pieces.iter().map(|p| p.kernel.domain[1]).collect();
        assert_eq!(cols, [2, 2, 3]);
        // Never one column a piece (it would sum along its innermost axis instead).
        let cols: Vec<usize> = cut(&k, 16, 1)
            .expect("cut")
            .iter()
            .map(|p| p.kernel.domain[1])
            .collect();
        assert_eq!(cols, [2, 2, 3]);
        assert!(pieces.iter().all(|p| p.kernel.domain[0] == 10));
        let starts: Vec<usize> = pieces.iter().map(|p| p.output_start[0]).collect();
        assert_eq!(starts, [0, 2, 4]);
        let offsets: Vec<usize> = pieces
            .iter()
            .map(|p| p.kernel.inputs[0].access.offset)
            .collect();
        assert_eq!(offsets, [0, 2, 4]);
        // With the full exp stored too, a range of columns is not contiguous in it.
        k.outputs.push(Output { value: 2 });
        assert_eq!(cut(&k, 3, 1), None);
    }

    #[test]
    fn a_reduced_or_indexed_outer_axis_is_not_cut() {
        let mut k = softmax(10, 7);
        k.reduce_axes = vec![0, 1];
        assert_eq!(cut(&k, 4, 1), None);
        let mut k = softmax(10, 7);
        k.body.push(Inst::Index {
            axis: 0,
            dtype: DType::F32,
        });
        assert_eq!(cut(&k, 4, 1), None);
    }

    #[test]
    fn small_kernels_make_fewer_pieces_or_none() {
        let k = softmax(8, 100);
        assert_eq!(cut(&k, 16, 200).map(|p| p.len()), Some(4));
        assert_eq!(cut(&k, 16, 1000), None);
        // Size-1 outer axes are skipped.
        let mut k = softmax(8, 100);
        k.domain.insert(0, 1);
        k.reduce_axes = vec![2];
        k.inputs[0].access.strides.insert(0, 0);
        assert_eq!(cut_axis(&k), Some(1));
    }
}
