//! Sum and max reductions over any set of axes of a row-major tensor.
//!
//! # Summation order (deterministic, accurate at any length)
//! The order in which a sum adds its terms is a fixed function of the shape and the reduced axes,
//! never of timing or threads, so a sum gives the same bits on every run. f32 sums accumulate in
//! f32, yet stay accurate at any length: no accumulator takes more than [`RUN_BLOCK`]` / 8` terms
//! of a contiguous run, or [`FAN`] values anywhere else, one after another (a cascade of partial
//! sums, as PyTorch's cascade sum), so the sum of 2^27 ones is exact and the error of a long sum
//! grows with the logarithm of its length, not with its length.
//! - First the shape is simplified: size-1 axes are dropped and adjacent axes that are both
//!   reduced or both kept are merged (this does not change any output element's terms).
//! - If the innermost remaining axis is **reduced** (a reduction along the last axis, as in
//!   softmax or layer norm), each contiguous run of `n` terms is cut into blocks of
//!   [`RUN_BLOCK`] terms (the last one shorter); a block is summed into eight interleaved partial
//!   sums (term `i` of the block goes to partial `i % 8`, each in index order, from zero),
//!   combined as `((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))`. The block sums of an
//!   output element, run after run in row-major order of the outer reduced axes, go to a
//!   [`Cascade`]; with one block, the block's sum is the result.
//! - If the innermost axis is **kept** (for instance a bias gradient, summed over the batch),
//!   every output element's terms, in row-major order of the reduced axes, go to a [`Cascade`];
//!   the loop runs across the contiguous kept axis, so it vectorizes.
//!
//! A [`Cascade`] adds its values one after another from zero, [`FAN`] at a time: when its level
//! 0 holds [`FAN`] values and another comes, level 0's sum moves up into level 1 (which works
//! the same way, up to [`LEVELS`] levels) and level 0 restarts from zero; at the end the levels
//! are added, `acc[top] + (… + (acc[1] + acc[0]))`. Integer sums wrap (their order does not
//! matter). Max does not cascade (it is exact): a run goes to eight interleaved partial maxima
//! combined as sums are, runs and kept-axis terms fold one after another. `max` propagates NaN
//! (a NaN term makes the result NaN), as PyTorch's `amax` and XLA's `reduce_max` do; of `0.0`
//! and `-0.0` the earlier stays. A max over an empty axis is the lowest value (negative
//! infinity for floats).

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

/// Terms of a contiguous run summed as one block (into eight partials of `RUN_BLOCK / 8`
/// terms each) before the block's sum goes to the cascade. A multiple of 8, so that a block's
/// partials stay aligned with the run.
pub const RUN_BLOCK: usize = 1024;

/// Values each level of a [`Cascade`] adds one after another before it moves its sum up.
pub const FAN: usize = 64;

/// Levels of a [`Cascade`]: [`FAN`]^8 = 2^48 values before the top level adds more than
/// [`FAN`] of them.
pub const LEVELS: usize = 8;

/// The running state of a cascaded sum is `LEVELS` partial sums, level 0 first, zero before the
/// first value. Value `k` (counting from 0) is added into level 0; before it is, when `k` is a
/// positive multiple of [`FAN`], level 0 (which then holds [`FAN`] values) is first added into
/// level 1 and restarts from zero, and level 1 does the same with its own count, and so on (the
/// top level never moves up). The state holds no count: the caller passes each value's index,
/// so that a cascade can live in a slot of plain values (the fused kernels keep theirs in their
/// scratch memory, one per lane).
pub struct Cascade;

impl Cascade {
    /// How many levels move up before value `k` is added.
    #[inline(always)]
    fn carries(mut k: usize) -> usize {
        let mut f = 0;
        while f + 1 < LEVELS && k > 0 && k.is_multiple_of(FAN) {
            f += 1;
            k = k / FAN - 1;
        }
        f
    }

    /// Adds value `k` (its index, from 0) into the levels `acc` (at least [`LEVELS`] of them,
    /// zero before value 0).
    #[inline(always)]
    pub fn push<T: Scalar>(acc: &mut [T], k: usize, v: T) {
        let f = Self::carries(k);
        for m in (0..f).rev() {
            acc[m + 1] = acc[m + 1].add(acc[m]);
            acc[m] = T::ZERO;
        }
        acc[0] = acc[0].add(v);
    }

    /// As [`Cascade::push`], for `w = v.len()` independent cascades side by side, every one at
    /// value index `k`: level 0 of cascade `j` is `l0[j]`, level `l ≥ 1` is
    /// `upper[(l - 1) * w + j]` (`upper` holds `(LEVELS - 1) * w` values).
    #[inline]
    pub fn push_lanes<T: Scalar>(l0: &mut [T], upper: &mut [T], k: usize, v: &[T]) {
        let w = v.len();
        let f = Self::carries(k);
        for m in (0..f).rev() {
            let (below, above) = upper.split_at_mut(m * w);
            let dst = &mut above[..w];
            let src: &mut [T] = if m == 0 {
                &mut l0[..w]
            } else {
                &mut below[(m - 1) * w..m * w]
            };
            for (u, l) in dst.iter_mut().zip(src.iter_mut()) {
                *u = u.add(*l);
                *l = T::ZERO;
            }
        }
        for (a, &x) in l0[..w].iter_mut().zip(v) {
            *a = a.add(x);
        }
    }

    /// As [`Cascade::finish`] for the cascades of [`Cascade::push_lanes`], into `l0`.
    #[inline]
    pub fn finish_lanes<T: Scalar>(l0: &mut [T], upper: &[T], n: usize) {
        let w = l0.len();
        for l in 1..Self::used(n) {
            for (r, &a) in l0.iter_mut().zip(&upper[(l - 1) * w..l * w]) {
                *r = a.add(*r);
            }
        }
    }

    /// Levels that hold something after `n` values: 0 for none, else at least 1.
    #[inline(always)]
    pub fn used(n: usize) -> usize {
        let (mut c, mut l) = (n, 0);
        while c > 0 && l < LEVELS {
            l += 1;
            c = (c - 1) / FAN;
        }
        l
    }

    /// The sum of the `n` values pushed: level 0, then each further level that holds
    /// something added in front, `acc[l] + (… + acc[0])`.
    #[inline(always)]
    pub fn finish<T: Scalar>(acc: &[T], n: usize) -> T {
        let mut r = acc[0];
        for &a in acc.iter().take(Self::used(n)).skip(1) {
            r = a.add(r);
        }
        r
    }
}

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

/// The sum of one block of a run (at most [`RUN_BLOCK`] terms): eight interleaved partials.
#[inline]
pub fn sum_block<T: Scalar>(x: &[T]) -> T {
    run(x, T::ZERO, T::add)
}

/// Pushes the blocks of the run `x` into `acc`, the first as value `k`; returns the index after
/// the last.
#[inline]
fn push_run<T: Scalar>(acc: &mut [T], mut k: usize, x: &[T]) -> usize {
    for b in x.chunks(RUN_BLOCK) {
        Cascade::push(acc, k, sum_block(b));
        k += 1;
    }
    k
}

/// The sum of a contiguous run, in the fixed order described in the module docs (blocks of
/// [`RUN_BLOCK`] terms, each into eight interleaved partial sums combined pairwise; the blocks'
/// sums cascaded).
pub fn sum_run<T: Scalar>(x: &[T]) -> T {
    if x.len() <= RUN_BLOCK {
        return sum_block(x);
    }
    let mut acc = [T::ZERO; LEVELS];
    let blocks = push_run(&mut acc, 0, x);
    Cascade::finish(&acc, blocks)
}

/// The maximum of a contiguous run (the lowest value when empty).
pub fn max_run<T: Scalar>(x: &[T]) -> T {
    run(x, T::LOWEST, keep_max)
}

/// `max` as reductions compute it: `x` replaces `acc` when strictly greater or NaN, so a NaN
/// term makes the result NaN (a NaN `acc` stays, since nothing compares greater) and of `0.0`
/// and `-0.0` the earlier stays. Written as comparisons so that it vectorizes.
#[inline(always)]
pub fn keep_max<T: Scalar>(acc: T, x: T) -> T {
    if x > acc || x.is_nan() {
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
        if kind == ReduceKind::Sum {
            // The blocks of each output's runs go through one cascade.
            let split = Split::of(&gd[..g - 1], &gr[..g - 1], n);
            let mut o = 0;
            split.for_each_row(|base| {
                let mut acc = [T::ZERO; LEVELS];
                let mut k = 0;
                split.for_each_term(base, |at| {
                    k = push_run(&mut acc, k, &src[at..at + n]);
                });
                dst[o] = Cascade::finish(&acc, k);
                o += 1;
            });
            return;
        }
        dst.fill(kind.identity());
        for_each_input_row(src, n, outer, outer_ost, |o, row| match kind {
            ReduceKind::Sum => dst[o] = dst[o].add(sum_run(row)),
            ReduceKind::Max => dst[o] = keep_max(dst[o], max_run(row)),
        });
    } else {
        let split = Split::of(&gd[..g - 1], &gr[..g - 1], n);
        if kind == ReduceKind::Sum && split.terms > FAN {
            // Too many terms for one accumulator: each output element's terms go through a
            // cascade, a tile of `TILE` adjacent outputs at a time (its levels on the stack).
            const TILE: usize = 64;
            let mut o = 0;
            split.for_each_row(|base| {
                for c0 in (0..n).step_by(TILE) {
                    let w = TILE.min(n - c0);
                    let mut l0 = [T::ZERO; TILE];
                    let mut upper = [T::ZERO; TILE * (LEVELS - 1)];
                    let mut k = 0;
                    split.for_each_term(base + c0, |at| {
                        Cascade::push_lanes(
                            &mut l0,
                            &mut upper[..w * (LEVELS - 1)],
                            k,
                            &src[at..at + w],
                        );
                        k += 1;
                    });
                    Cascade::finish_lanes(&mut l0[..w], &upper[..w * (LEVELS - 1)], k);
                    dst[o + c0..o + c0 + w].copy_from_slice(&l0[..w]);
                }
                o += n;
            });
            return;
        }
        // Innermost group kept: accumulate whole contiguous rows into output rows.
        dst.fill(kind.identity());
        for_each_input_row(src, n, outer, outer_ost, |o, row| {
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

/// The outer groups of a simplified shape split into kept and reduced ones, with their strides
/// in the source: the cascaded paths visit each output's terms together (an output's terms in
/// row-major order of the reduced groups, as the streaming paths add them).
struct Split {
    kept: Dims,
    kept_st: Dims,
    red: Dims,
    red_st: Dims,
    /// Terms (runs, or rows of the inner group) per output element.
    terms: usize,
}

impl Split {
    /// `gd`, `gr`: the outer groups' sizes and kinds; `inner`: elements of the innermost group.
    fn of(gd: &[usize], gr: &[bool], inner: usize) -> Split {
        let mut sp = Split {
            kept: Dims::new(),
            kept_st: Dims::new(),
            red: Dims::new(),
            red_st: Dims::new(),
            terms: 1,
        };
        let mut st = inner;
        let mut all: smallvec::SmallVec<[(usize, usize, bool); 8]> = smallvec::SmallVec::new();
        for i in (0..gd.len()).rev() {
            all.push((gd[i], st, gr[i]));
            st *= gd[i];
        }
        for &(d, s, r) in all.iter().rev() {
            if r {
                sp.red.push(d);
                sp.red_st.push(s);
                sp.terms *= d;
            } else {
                sp.kept.push(d);
                sp.kept_st.push(s);
            }
        }
        sp
    }

    /// Calls `f` with each output row's source offset, outputs in row-major order.
    fn for_each_row(&self, f: impl FnMut(usize)) {
        super::layout::for_each_outer(0, &self.kept, &self.kept_st, f)
    }

    /// Calls `f` with the source offset of each term of the row at `base`, in order.
    fn for_each_term(&self, base: usize, f: impl FnMut(usize)) {
        super::layout::for_each_outer(base, &self.red, &self.red_st, f)
    }
}

/// Visits every multi-index of `dims` in row-major order, passing `Σ index_k * strides[k]`.
#[inline]
fn for_each_out_offset(dims: &[usize], strides: &[usize], f: impl FnMut(usize)) {
    super::layout::for_each_outer(0, dims, strides, f)
}

/// Visits the contiguous runs of `n` elements of `src` in order, each with the offset of its
/// output (`outer`'s multi-indices in row-major order, by `outer_ost`): the walk of both
/// reductions whose innermost group stays contiguous, whether it is reduced or kept.
#[inline]
fn for_each_input_row<T>(
    src: &[T],
    n: usize,
    outer: &[usize],
    outer_ost: &[usize],
    mut f: impl FnMut(usize, &[T]),
) {
    let mut in_off = 0;
    for_each_out_offset(outer, outer_ost, |o| {
        f(o, &src[in_off..in_off + n]);
        in_off += n;
    });
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
    fn a_cascade_of_2_pow_27_plus_16_ones_is_exact_and_fills_five_levels() {
        let n = (1usize << 27) + 16;
        let mut acc = [0f32; LEVELS];
        for k in 0..n {
            Cascade::push(&mut acc, k, 1.0);
        }
        // 64^4 = 2^24 < n: levels 0 to 4 hold something.
        assert_eq!(Cascade::used(n), 5);
        assert_eq!(Cascade::finish(&acc, n) as usize, n);
        let mut acc = [0f32; LEVELS];
        for k in 0..(1usize << 25) {
            Cascade::push(&mut acc, k, 1.0);
        }
        assert_eq!(Cascade::finish(&acc, 1 << 25), (1u32 << 25) as f32);
    }

    #[test]
    fn cascades_side_by_side_give_each_cascade_s_bits() {
        let (w, n) = (5usize, 300_000usize);
        let v = |k: usize, j: usize| ((k * 7919 + j * 104_729) % 1000) as f32 * 1e-3 - 0.3;
        let mut l0 = vec![0f32; w];
        let mut upper = vec![0f32; (LEVELS - 1) * w];
        let mut one = vec![[0f32; LEVELS]; w];
        for k in 0..n {
            let row: Vec<f32> = (0..w).map(|j| v(k, j)).collect();
            Cascade::push_lanes(&mut l0, &mut upper, k, &row);
            for (j, acc) in one.iter_mut().enumerate() {
                Cascade::push(acc, k, row[j]);
            }
        }
        Cascade::finish_lanes(&mut l0, &upper, n);
        for j in 0..w {
            assert_eq!(
                l0[j].to_bits(),
                Cascade::finish(&one[j], n).to_bits(),
                "lane {j}"
            );
        }
    }

    #[test]
    fn a_sum_of_up_to_one_block_is_its_eight_partials_and_longer_runs_cascade_blocks() {
        let x: Vec<f32> = (0..3000).map(|i| 1.0 / (i as f32 + 1.0)).collect();
        assert_eq!(
            sum_run(&x[..1024]).to_bits(),
            sum_block(&x[..1024]).to_bits()
        );
        let mut acc = [0f32; LEVELS];
        for (k, b) in x.chunks(RUN_BLOCK).enumerate() {
            Cascade::push(&mut acc, k, sum_block(b));
        }
        // Three blocks: level 0 only, 0 + b0 + b1 + b2.
        let want =
            ((0.0 + sum_block(&x[..1024])) + sum_block(&x[1024..2048])) + sum_block(&x[2048..]);
        assert_eq!(Cascade::finish(&acc, 3).to_bits(), want.to_bits());
        assert_eq!(sum_run(&x).to_bits(), want.to_bits());
    }

    #[test]
    fn integer_sums_wrap_instead_of_panicking() {
        let mut out = [0i32];
        reduce(ReduceKind::Sum, &[i32::MAX, 1], &[2], &[0], &mut out);
        assert_eq!(out[0], i32::MIN);
    }
}
