//! Row-major index math and strided copies: the one mechanism behind transpose, broadcast and
//! slice. Each of those reads its operand through a *strided view* (an offset plus one stride per
//! output axis, 0 on broadcast axes) and writes a contiguous row-major output, so a single
//! [`strided_copy`] with a few fast paths serves all three.
//!
//! Shapes up to [`INLINE_RANK`] axes are handled without touching the heap.

use smallvec::SmallVec;

/// Ranks up to this many axes are kept inline (no heap allocation).
pub const INLINE_RANK: usize = 8;

/// Dimension sizes or strides, inline up to [`INLINE_RANK`] axes.
pub type Dims = SmallVec<[usize; INLINE_RANK]>;

/// Number of elements of a shape (1 for a scalar).
pub fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Row-major strides in elements: the last axis has stride 1.
pub fn row_major_strides(dims: &[usize]) -> Dims {
    let mut s: Dims = SmallVec::from_elem(1, dims.len());
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The multi-index of row-major position `flat` in `dims`, written into `index`.
///
/// # Panics
/// If `index` does not have one entry per axis.
pub fn unravel(mut flat: usize, dims: &[usize], index: &mut [usize]) {
    assert_eq!(
        index.len(),
        dims.len(),
        "unravel: index has {} axes, shape has {}",
        index.len(),
        dims.len()
    );
    for i in (0..dims.len()).rev() {
        let d = dims[i].max(1);
        index[i] = flat % d;
        flat /= d;
    }
}

/// The row-major position of a multi-index (the inverse of [`unravel`]).
pub fn ravel(index: &[usize], dims: &[usize]) -> usize {
    index.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// Strides that read a row-major tensor of shape `src` as if broadcast to `dst` (NumPy rules:
/// axes align to the right, each source axis equals the target or is 1). Broadcast axes get
/// stride 0. `None` if `src` does not broadcast to `dst`.
pub fn broadcast_strides(src: &[usize], dst: &[usize]) -> Option<Dims> {
    if src.len() > dst.len() {
        return None;
    }
    let off = dst.len() - src.len();
    let src_strides = row_major_strides(src);
    let mut s: Dims = SmallVec::from_elem(0, dst.len());
    for (i, &d) in src.iter().enumerate() {
        if d == dst[off + i] {
            s[off + i] = src_strides[i];
        } else if d != 1 {
            return None;
        }
    }
    Some(s)
}

/// The shape and read strides of a transpose: output axis `i` is operand axis `perm[i]`.
/// `None` if `perm` is not a permutation of the operand's axes.
pub fn permuted(src: &[usize], perm: &[usize]) -> Option<(Dims, Dims)> {
    if perm.len() != src.len() || src.len() > 64 {
        return None;
    }
    let mut seen = 0u64;
    for &p in perm {
        if p >= src.len() || seen & (1 << p) != 0 {
            return None;
        }
        seen |= 1 << p;
    }
    let strides = row_major_strides(src);
    Some((
        perm.iter().map(|&p| src[p]).collect(),
        perm.iter().map(|&p| strides[p]).collect(),
    ))
}

/// Simplifies a strided view read into a contiguous output: drops size-1 axes and merges each
/// axis into the next one when they are contiguous in the source
/// (`stride[i] == stride[i+1] * dims[i+1]`; broadcast axes, stride 0, merge with each other).
/// The result walks the same elements in the same order with as few axes as possible.
pub fn coalesce(dims: &[usize], strides: &[usize]) -> (Dims, Dims) {
    let mut d = Dims::new();
    let mut s = Dims::new();
    for (&n, &st) in dims.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        match (d.last_mut(), s.last_mut()) {
            // The previous (outer) axis steps exactly over this one: merge them.
            (Some(pd), Some(ps)) if *ps == st * n => {
                *pd *= n;
                *ps = st;
            }
            _ => {
                d.push(n);
                s.push(st);
            }
        }
    }
    (d, s)
}

/// The largest source index a strided view touches, or `None` when it has no elements.
fn max_index(offset: usize, dims: &[usize], strides: &[usize]) -> Option<usize> {
    if dims.contains(&0) {
        return None;
    }
    Some(
        offset
            + dims
                .iter()
                .zip(strides)
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>(),
    )
}

/// Visits every multi-index of `dims` in row-major order, passing `offset + Σ index_k *
/// strides[k]` (the odometer keeps it incrementally: no divisions).
#[inline]
pub(crate) fn for_each_outer(
    offset: usize,
    dims: &[usize],
    strides: &[usize],
    mut f: impl FnMut(usize),
) {
    let rank = dims.len();
    let mut counter = [0usize; 64];
    let mut off = offset;
    loop {
        f(off);
        // Advance the odometer.
        let mut ax = rank;
        loop {
            if ax == 0 {
                return;
            }
            ax -= 1;
            counter[ax] += 1;
            off += strides[ax];
            if counter[ax] < dims[ax] {
                break;
            }
            off -= strides[ax] * dims[ax];
            counter[ax] = 0;
        }
    }
}

/// Tile edge of the blocked 2-D transpose.
const TILE: usize = 32;

/// Copies the strided view `(offset, dims, strides)` of `src` into `dst` in row-major order:
/// `dst[ravel(i)] = src[offset + Σ i_k * strides[k]]` for every multi-index `i` of `dims`.
///
/// Transpose, broadcast (stride 0) and slice (offset, the operand's own strides) are all this.
/// Fast paths after [`coalesce`]: a contiguous innermost run is a `copy_from_slice`, a broadcast
/// one a `fill`, and an innermost pair of axes that is a transposed matrix (source strides
/// `(1, s)`) is copied in 32×32 tiles. Allocates nothing for ranks up to [`INLINE_RANK`].
///
/// # Panics
/// If `dst.len()` is not the number of elements of `dims`, the view reads outside `src`, or the
/// rank exceeds 64.
pub fn strided_copy<T: Copy>(
    src: &[T],
    offset: usize,
    dims: &[usize],
    strides: &[usize],
    dst: &mut [T],
) {
    assert_eq!(
        dims.len(),
        strides.len(),
        "strided_copy: {} dims but {} strides",
        dims.len(),
        strides.len()
    );
    assert!(
        dims.len() <= 64,
        "strided_copy: rank {} exceeds 64",
        dims.len()
    );
    assert_eq!(
        dst.len(),
        numel(dims),
        "strided_copy: output has {} elements, shape {:?} needs {}",
        dst.len(),
        dims,
        numel(dims)
    );
    let Some(max) = max_index(offset, dims, strides) else {
        return;
    };
    assert!(max < src.len(), "strided_copy: view {dims:?} with strides {strides:?} at offset {offset} reads index {max}, source has {}", src.len());
    let (d, s) = coalesce(dims, strides);
    let rank = d.len();
    if rank == 0 {
        dst[0] = src[offset];
        return;
    }
    let (n, st) = (d[rank - 1], s[rank - 1]);
    if rank >= 2 && st != 1 && s[rank - 2] == 1 {
        // The two innermost axes are a transposed matrix: rows (stride 1 in the source) by
        // cols (stride `st`). Copy in tiles so both sides stay in cache.
        let rows = d[rank - 2];
        let block = rows * n;
        let mut out = 0;
        for_each_outer(offset, &d[..rank - 2], &s[..rank - 2], |base| {
            let dblock = &mut dst[out..out + block];
            out += block;
            for i0 in (0..rows).step_by(TILE) {
                let i1 = (i0 + TILE).min(rows);
                for j0 in (0..n).step_by(TILE) {
                    let j1 = (j0 + TILE).min(n);
                    for i in i0..i1 {
                        let drow = &mut dblock[i * n + j0..i * n + j1];
                        let mut p = base + i + j0 * st;
                        for o in drow {
                            // SAFETY: p <= max < src.len(), checked above for the whole view.
                            *o = unsafe { *src.get_unchecked(p) };
                            p += st;
                        }
                    }
                }
            }
        });
        return;
    }
    let mut out = 0;
    for_each_outer(offset, &d[..rank - 1], &s[..rank - 1], |base| {
        let drow = &mut dst[out..out + n];
        out += n;
        match st {
            1 => drow.copy_from_slice(&src[base..base + n]),
            0 => drow.fill(src[base]),
            _ => {
                let mut p = base;
                for o in drow {
                    // SAFETY: p <= max < src.len(), checked above for the whole view.
                    *o = unsafe { *src.get_unchecked(p) };
                    p += st;
                }
            }
        }
    });
}

/// Transposes a row-major `rows × cols` matrix into `dst` (`cols × rows`), in tiles.
///
/// # Panics
/// If either slice does not hold `rows * cols` elements.
pub fn transpose_2d<T: Copy>(src: &[T], rows: usize, cols: usize, dst: &mut [T]) {
    assert_eq!(
        src.len(),
        rows * cols,
        "transpose_2d: source has {} elements, not {rows}x{cols}",
        src.len()
    );
    strided_copy(src, 0, &[cols, rows], &[1, cols], dst);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition of a strided copy, one multi-index at a time.
    fn naive_strided_copy(
        src: &[i64],
        offset: usize,
        dims: &[usize],
        strides: &[usize],
    ) -> Vec<i64> {
        let n = numel(dims);
        let mut idx = vec![0; dims.len()];
        (0..n)
            .map(|f| {
                unravel(f, dims, &mut idx);
                src[offset + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>()]
            })
            .collect()
    }

    fn check(src: &[i64], offset: usize, dims: &[usize], strides: &[usize]) {
        let mut dst = vec![-1; numel(dims)];
        strided_copy(src, offset, dims, strides, &mut dst);
        assert_eq!(
            dst,
            naive_strided_copy(src, offset, dims, strides),
            "dims {dims:?} strides {strides:?} offset {offset}"
        );
    }

    #[test]
    fn every_transpose_of_a_rank_4_tensor_matches_the_definition() {
        let dims = [3usize, 1, 37, 40];
        let src: Vec<i64> = (0..numel(&dims) as i64).collect();
        let perms = permutations(4);
        assert_eq!(perms.len(), 24);
        for p in perms {
            let (d, s) = permuted(&dims, &p).unwrap();
            check(&src, 0, &d, &s);
        }
    }

    #[test]
    fn broadcasts_of_rows_columns_and_scalars_match_the_definition() {
        for (src_dims, dst_dims) in [
            (&[][..], &[3usize, 4][..]),
            (&[4], &[3, 4]),
            (&[3, 1], &[3, 4]),
            (&[1, 1], &[2, 3]),
            (&[2, 1, 4], &[3, 2, 5, 4]),
            (&[5], &[5]),
        ] {
            let src: Vec<i64> = (0..numel(src_dims) as i64).collect();
            let s = broadcast_strides(src_dims, dst_dims).unwrap();
            check(&src, 0, dst_dims, &s);
        }
        assert!(broadcast_strides(&[3], &[4]).is_none());
        assert!(broadcast_strides(&[2, 3], &[3]).is_none());
    }

    #[test]
    fn slices_along_each_axis_match_the_definition() {
        let dims = [4usize, 5, 6];
        let src: Vec<i64> = (0..numel(&dims) as i64).collect();
        let strides = row_major_strides(&dims);
        for axis in 0..3 {
            let mut d = dims;
            d[axis] = 2;
            check(&src, strides[axis], &d, &strides);
        }
    }

    #[test]
    fn a_large_transpose_uses_tiles_and_stays_exact() {
        let (r, c) = (67usize, 129usize);
        let src: Vec<i64> = (0..(r * c) as i64).collect();
        let mut dst = vec![0; r * c];
        transpose_2d(&src, r, c, &mut dst);
        for i in 0..r {
            for j in 0..c {
                assert_eq!(dst[j * r + i], src[i * c + j]);
            }
        }
    }

    #[test]
    fn coalescing_merges_contiguous_and_broadcast_axes() {
        let (d, s) = coalesce(&[2, 3, 4], &[12, 4, 1]);
        assert_eq!((&d[..], &s[..]), (&[24usize][..], &[1usize][..]));
        let (d, s) = coalesce(&[2, 3, 4], &[0, 0, 1]);
        assert_eq!((&d[..], &s[..]), (&[6usize, 4][..], &[0usize, 1][..]));
        let (d, s) = coalesce(&[1, 5, 1], &[7, 1, 9]);
        assert_eq!((&d[..], &s[..]), (&[5usize][..], &[1usize][..]));
    }

    #[test]
    fn ravel_inverts_unravel() {
        let dims = [3usize, 4, 5];
        let mut idx = [0; 3];
        for f in 0..60 {
            unravel(f, &dims, &mut idx);
            assert_eq!(ravel(&idx, &dims), f);
        }
    }

    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut out = vec![];
        for p in permutations(n - 1) {
            for pos in 0..n {
                let mut q = p.clone();
                q.insert(pos, n - 1);
                out.push(q);
            }
        }
        out
    }
}
