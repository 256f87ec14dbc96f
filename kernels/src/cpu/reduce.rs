//! Sum and max reductions over any set of axes of a row-major tensor.
//!
//! # Summation order (deterministic)
//! The order in which a sum adds its terms is a fixed function of the shape and the reduced axes,
//! never of timing or threads, so a sum gives the same bits on every run:
//! - First the shape is simplified: size-1 axes are dropped and adjacent axes that are both
//!   reduced or both kept are merged (this does not change any output element's terms).
//! - If the innermost remaining axis is **reduced** (a reduction along the last axis, as in
//!   softmax or layer norm), each contiguous run of `n` terms is summed by [`sum_run`]: eight
//!   interleaved partial sums (term `i` goes to partial `i % 8`, each in index order), combined as
//!   `((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))`. When an output element has several
//!   runs (outer axes are reduced too), their sums are added one after another in row-major
//!   order, starting from zero; with one run, the run's sum is the result.
//! - If the innermost axis is **kept** (for instance a bias gradient, summed over the batch),
//!   every output element starts at zero and adds its terms one by one in row-major order of
//!   the reduced axes; the loop runs across the contiguous kept axis, so it vectorizes.
//!
//! f32 sums accumulate in f32. Integer sums wrap. `max` ignores NaN terms as [`f32::max`]
//! does (a run of NaNs only gives negative infinity); a max over an empty axis is the lowest
//! value (negative infinity for floats).

use super::layout::{numel, Dims};
use super::scalar::Scalar;

/// Which reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Max,
}

impl ReduceKind {
    #[inline(always)]
    fn identity<T: Scalar>(self) -> T {
        match self {
            ReduceKind::Sum => T::ZERO,
            ReduceKind::Max => T::LOWEST,
        }
    }
}

/// Number of interleaved partial results in a contiguous run.
const LANES: usize = 8;

#[inline(always)]
fn run<T: Scalar>(x: &[T], init: T, f: impl Fn(T, T) -> T) -> T {
    let mut acc = [init; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] = f(acc[j], c[j]);
        }
    }
    for (j, &v) in chunks.remainder().iter().enumerate() {
        acc[j] = f(acc[j], v);
    }
    f(
        f(f(acc[0], acc[4]), f(acc[2], acc[6])),
        f(f(acc[1], acc[5]), f(acc[3], acc[7])),
    )
}

/// The sum of a contiguous run, in the fixed order described in the module docs
/// (eight interleaved partial sums combined pairwise).
pub fn sum_run<T: Scalar>(x: &[T]) -> T {
    run(x, T::ZERO, T::add)
}

/// The maximum of a contiguous run (the lowest value when empty).
pub fn max_run<T: Scalar>(x: &[T]) -> T {
    run(x, T::LOWEST, keep_max)
}

/// `max` as reductions compute it: `x` replaces `acc` only when strictly greater, so NaN terms
/// are ignored (as [`f32::max`] does) and of `0.0` and `-0.0` the earlier stays. Written as a
/// comparison so that it vectorizes to one `max` instruction.
#[inline(always)]
fn keep_max<T: Scalar>(acc: T, x: T) -> T {
    if x > acc {
        x
    } else {
        acc
    }
}

/// Reduces each row of a row-major `[rows, n]` matrix: `dst[r] = reduce(src[r*n .. (r+1)*n])`.
/// The fast path of a reduction along the last axis.
///
/// # Panics
/// If `src.len() != dst.len() * n`.
pub fn reduce_rows<T: Scalar>(kind: ReduceKind, src: &[T], n: usize, dst: &mut [T]) {
    assert_eq!(
        src.len(),
        dst.len() * n,
        "reduce_rows: {} elements are not {} rows of {n}",
        src.len(),
        dst.len()
    );
    if n == 0 {
        dst.fill(kind.identity());
        return;
    }
    match kind {
        ReduceKind::Sum => {
            for (o, row) in dst.iter_mut().zip(src.chunks_exact(n)) {
                *o = sum_run(row);
            }
        }
        ReduceKind::Max => {
            for (o, row) in dst.iter_mut().zip(src.chunks_exact(n)) {
                *o = max_run(row);
            }
        }
    }
}

/// Reduces the row-major tensor `src` of shape `dims` over `axes` into `dst`, whose shape is
/// `dims` with each reduced axis set to 1 (so `dst` has `numel / Π dims[axes]` elements).
/// The summation order is fixed; see the module docs. Allocates nothing.
///
/// # Panics
/// If an axis is out of range or repeated, the rank exceeds 64, or the slice lengths do not
/// match the shape.
pub fn reduce<T: Scalar>(
    kind: ReduceKind,
    src: &[T],
    dims: &[usize],
    axes: &[usize],
    dst: &mut [T],
) {
    assert!(dims.len() <= 64, "reduce: rank {} exceeds 64", dims.len());
    let mut mask = 0u64;
    for &a in axes {
        assert!(
            a < dims.len() && mask & (1 << a) == 0,
            "reduce: axes {axes:?} out of range or repeated for rank {}",
            dims.len()
        );
        mask |= 1 << a;
    }
    let n_in = numel(dims);
    let n_out: usize = dims
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) == 0)
        .map(|(_, &d)| d)
        .product();
    assert_eq!(
        src.len(),
        n_in,
        "reduce: source has {} elements, shape {dims:?} needs {n_in}",
        src.len()
    );
    assert_eq!(
        dst.len(),
        n_out,
        "reduce: output has {} elements, needs {n_out}",
        dst.len()
    );
    if n_out == 0 {
        return;
    }
    if n_in == 0 {
        dst.fill(kind.identity());
        return;
    }

    // Simplify: drop size-1 axes, merge neighbours that are both reduced or both kept.
    let mut gd = Dims::new(); // group sizes
    let mut gr: smallvec::SmallVec<[bool; 8]> = smallvec::SmallVec::new(); // group reduced?
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let r = mask & (1 << i) != 0;
        match (gd.last_mut(), gr.last()) {
            (Some(pd), Some(&pr)) if pr == r => *pd *= d,
            _ => {
                gd.push(d);
                gr.push(r);
            }
        }
    }
    let g = gd.len();
    if g == 0 || gr.iter().all(|&r| !r) {
        // Nothing is actually reduced (every reduced axis has size 1).
        dst.copy_from_slice(src);
        return;
    }
    // Output strides of each group (0 for reduced groups).
    let mut ost = Dims::from_elem(0, g);
    let mut s = 1;
    for i in (0..g).rev() {
        if !gr[i] {
            ost[i] = s;
            s *= gd[i];
        }
    }

    let n = gd[g - 1];
    let outer = &gd[..g - 1];
    let outer_ost = &ost[..g - 1];
    if gr[g - 1] {
        // Innermost group reduced: reduce each contiguous run, then fold runs into their output.
        if g == 1 {
            dst[0] = match kind {
                ReduceKind::Sum => sum_run(src),
                ReduceKind::Max => max_run(src),
            };
            return;
        }
        if g == 2 {
            // [kept, reduced]: exactly one run per output element.
            reduce_rows(kind, src, n, dst);
            return;
        }
        dst.fill(kind.identity());
        let mut in_off = 0;
        for_each_out_offset(outer, outer_ost, |o| {
            let row = &src[in_off..in_off + n];
            in_off += n;
            match kind {
                ReduceKind::Sum => dst[o] = dst[o].add(sum_run(row)),
                ReduceKind::Max => dst[o] = keep_max(dst[o], max_run(row)),
            }
        });
    } else {
        // Innermost group kept: accumulate whole contiguous rows into output rows.
        dst.fill(kind.identity());
        let mut in_off = 0;
        for_each_out_offset(outer, outer_ost, |o| {
            let row = &src[in_off..in_off + n];
            in_off += n;
            let out = &mut dst[o..o + n];
            match kind {
                ReduceKind::Sum => {
                    for (d, &x) in out.iter_mut().zip(row) {
                        *d = d.add(x);
                    }
                }
                ReduceKind::Max => {
                    for (d, &x) in out.iter_mut().zip(row) {
                        *d = keep_max(*d, x);
                    }
                }
            }
        });
    }
}

/// Visits every multi-index of `dims` in row-major order, passing `Σ index_k * strides[k]`.
#[inline]
fn for_each_out_offset(dims: &[usize], strides: &[usize], f: impl FnMut(usize)) {
    super::layout::for_each_outer(0, dims, strides, f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::layout::unravel;

    fn naive(kind: ReduceKind, src: &[f64], dims: &[usize], axes: &[usize]) -> Vec<f64> {
        let odims: Vec<usize> = dims
            .iter()
            .enumerate()
            .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
            .collect();
        let mut out = vec![
            if kind == ReduceKind::Sum {
                0.0
            } else {
                f64::NEG_INFINITY
            };
            numel(&odims)
        ];
        let mut idx = vec![0; dims.len()];
        for (f, &x) in src.iter().enumerate() {
            unravel(f, dims, &mut idx);
            for &a in axes {
                idx[a] = 0;
            }
            let o = crate::cpu::layout::ravel(&idx, &odims);
            out[o] = if kind == ReduceKind::Sum {
                out[o] + x
            } else {
                out[o].max(x)
            };
        }
        out
    }

    #[test]
    fn every_axis_subset_of_a_rank_4_tensor_matches_the_definition() {
        let dims = [3usize, 1, 4, 5];
        // Small integers keep every f64 sum exact whatever the order.
        let src: Vec<f64> = (0..numel(&dims))
            .map(|i| ((i * 7919) % 23) as f64 - 11.0)
            .collect();
        for subset in 1u32..16 {
            let axes: Vec<usize> = (0..4).filter(|a| subset & (1 << a) != 0).collect();
            for kind in [ReduceKind::Sum, ReduceKind::Max] {
                let want = naive(kind, &src, &dims, &axes);
                let mut got = vec![f64::NAN; want.len()];
                reduce(kind, &src, &dims, &axes, &mut got);
                assert_eq!(got, want, "{kind:?} over {axes:?}");
            }
        }
    }

    #[test]
    fn the_sum_of_a_run_uses_eight_interleaved_partials() {
        let x: Vec<f32> = (0..19).map(|i| 1.0 / (i as f32 + 1.0)).collect();
        let mut p = [0f32; 8];
        for (i, &v) in x.iter().enumerate() {
            p[i % 8] += v;
        }
        let want = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
        assert_eq!(sum_run(&x).to_bits(), want.to_bits());
    }

    #[test]
    fn integer_sums_wrap_instead_of_panicking() {
        let mut out = [0i32];
        reduce(ReduceKind::Sum, &[i32::MAX, 1], &[2], &[0], &mut out);
        assert_eq!(out[0], i32::MIN);
    }
}
