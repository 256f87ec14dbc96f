//! Matrix products on the CPU, through the `matrixmultiply` crate's packed GEMM.
//!
//! - [`gemm`]: one product `C ← α·A·B + β·C` where each matrix lives anywhere in its slice with
//!   arbitrary (non-negative) row and column strides, so a transposed operand is read in place
//!   by swapping its strides, without a copy.
//! - [`batched_matmul`]: a batch of row-major products, each operand optionally transposed
//!   ([`Trans`]), optionally accumulating into `C`.
//! - [`matmul`]: the plain batched product `[b, m, k] × [b, k, n] → [b, m, n]`.
//!
//! # Threads and determinism
//! With its `threading` feature, `matrixmultiply` splits the rows and columns of `C` between up
//! to `min(physical cores, 4)` threads (set `MATMUL_NUM_THREADS` to override), for products large
//! enough to pay for it (`m·k + k·n ≥ 2¹⁴` elements per extra thread). The reduction over `k` is
//! never split: each element of `C` is computed by one thread, from the same packed panels, in the
//! same order whatever the number of threads. Results are therefore bit-identical run to run and
//! for any thread count on one machine (the micro-kernel chosen — AVX2+FMA, AVX, SSE2 — depends
//! on the CPU, so different machines may differ in the last bits).
//!
//! # Scratch
//! These functions take no scratch buffer, but `matrixmultiply` makes one heap allocation in
//! every call, for its packing buffers (at most about 1.2 MiB for f32 with the AVX-512 kernel;
//! a batched product makes one per batch entry). Its thread pool does not allocate to dispatch
//! work. A step that must not touch the heap needs a GEMM that packs into caller-provided
//! memory instead.

/// An element type the GEMM supports: `f32` or `f64`.
pub trait GemmScalar: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    const ZERO: Self;
    const ONE: Self;
    /// The raw strided GEMM of `matrixmultiply` for this type.
    ///
    /// # Safety
    /// Every element that the dimensions and strides address must lie inside the allocation
    /// behind each pointer, and `C`'s strides must not make two elements alias.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

/// `GemmScalar` for a float type whose `matrixmultiply` GEMM is `$gemm`: the two impls differ
/// only in these names.
macro_rules! gemm_scalar {
    ($t:ty, $gemm:path) => {
        impl GemmScalar for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: $t,
                a: *const $t,
                rsa: isize,
                csa: isize,
                b: *const $t,
                rsb: isize,
                csb: isize,
                beta: $t,
                c: *mut $t,
                rsc: isize,
                csc: isize,
            ) {
                $gemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
            }
        }
    };
}

gemm_scalar!(f32, matrixmultiply::sgemm);
gemm_scalar!(f64, matrixmultiply::dgemm);

/// Whether a stored operand is used as is or transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Trans {
    /// Used as stored (row-major).
    N,
    /// Stored row-major as the transpose of the operand the product uses.
    T,
}

/// Where a matrix lives in a slice: element `(i, j)` is at `offset + i·row_stride + j·col_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatLayout {
    pub offset: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl MatLayout {
    /// A row-major matrix with `cols` columns, at offset 0.
    pub fn row_major(cols: usize) -> MatLayout {
        MatLayout {
            offset: 0,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// A column-major matrix with `rows` rows (the transpose of a row-major `[cols, rows]`
    /// matrix, read in place), at offset 0.
    pub fn col_major(rows: usize) -> MatLayout {
        MatLayout {
            offset: 0,
            row_stride: 1,
            col_stride: rows,
        }
    }

    /// The same layout starting at `offset`.
    pub fn at(self, offset: usize) -> MatLayout {
        MatLayout { offset, ..self }
    }

    /// The layout of `rows × cols` matrix stored row-major, used as is (`N`) or transposed (`T`):
    /// for `T` the stored matrix is `cols × rows`.
    pub fn stored(trans: Trans, rows: usize, cols: usize) -> MatLayout {
        match trans {
            Trans::N => MatLayout::row_major(cols),
            Trans::T => MatLayout::col_major(rows),
        }
    }

    /// The largest index a `rows × cols` matrix in this layout touches (`None` if it is empty).
    pub fn max_index(self, rows: usize, cols: usize) -> Option<usize> {
        if rows == 0 || cols == 0 {
            return None;
        }
        Some(self.offset + (rows - 1) * self.row_stride + (cols - 1) * self.col_stride)
    }
}

fn check_fits(name: &str, len: usize, l: MatLayout, rows: usize, cols: usize) {
    if let Some(max) = l.max_index(rows, cols) {
        assert!(max < len, "gemm: {name} ({rows}x{cols}, {l:?}) reads index {max}, but its slice has {len} elements");
    }
}

/// `C ← α·A·B + β·C` for an `m × k` matrix `A`, a `k × n` matrix `B` and an `m × n` matrix `C`,
/// each at its own [`MatLayout`] in its slice. A transposed operand is just a layout with its
/// strides swapped ([`MatLayout::col_major`]), read in place. When `β` is zero, `C` is
/// overwritten (its old contents, NaN included, are ignored).
///
/// # Panics
/// If a layout reaches outside its slice, or `C`'s layout makes two elements share an index.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: GemmScalar>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    la: MatLayout,
    b: &[T],
    lb: MatLayout,
    beta: T,
    c: &mut [T],
    lc: MatLayout,
) {
    if m == 0 || n == 0 {
        return;
    }
    check_fits("A", a.len(), la, m, k);
    check_fits("B", b.len(), lb, k, n);
    check_fits("C", c.len(), lc, m, n);
    let distinct = m == 1 && (n == 1 || lc.col_stride > 0)
        || n == 1 && lc.row_stride > 0
        || lc.col_stride > 0 && lc.row_stride >= n * lc.col_stride
        || lc.row_stride > 0 && lc.col_stride >= m * lc.row_stride;
    assert!(
        distinct,
        "gemm: C's layout {lc:?} makes elements of a {m}x{n} matrix alias"
    );
    // The pointers handed to matrixmultiply must be in bounds even when k == 0.
    let pa = if k == 0 {
        a.as_ptr()
    } else {
        a[la.offset..].as_ptr()
    };
    let pb = if k == 0 {
        b.as_ptr()
    } else {
        b[lb.offset..].as_ptr()
    };
    let pc = c[lc.offset..].as_mut_ptr();
    // SAFETY: every addressed element was checked to lie inside its slice, and C does not alias.
    unsafe {
        T::gemm_raw(
            m,
            k,
            n,
            alpha,
            pa,
            la.row_stride as isize,
            la.col_stride as isize,
            pb,
            lb.row_stride as isize,
            lb.col_stride as isize,
            beta,
            pc,
            lc.row_stride as isize,
            lc.col_stride as isize,
        )
    }
}

/// A batch of products `C_i = op(A_i)·op(B_i)` (plus the old `C_i` when `accumulate`), for
/// `i` in `0..batch`. `C` is row-major `[batch, m, n]`. `A` is row-major `[batch, m, k]` for
/// [`Trans::N`], or `[batch, k, m]` for [`Trans::T`] (read transposed in place, no copy);
/// likewise `B` is `[batch, k, n]` or `[batch, n, k]`.
///
/// # Panics
/// If a slice does not have exactly the length its shape needs.
#[allow(clippy::too_many_arguments)]
pub fn batched_matmul<T: GemmScalar>(
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    ta: Trans,
    b: &[T],
    tb: Trans,
    c: &mut [T],
    accumulate: bool,
) {
    assert_eq!(
        a.len(),
        batch * m * k,
        "matmul: A has {} elements, [{batch}, {m}, {k}] needs {}",
        a.len(),
        batch * m * k
    );
    assert_eq!(
        b.len(),
        batch * k * n,
        "matmul: B has {} elements, [{batch}, {k}, {n}] needs {}",
        b.len(),
        batch * k * n
    );
    assert_eq!(
        c.len(),
        batch * m * n,
        "matmul: C has {} elements, [{batch}, {m}, {n}] needs {}",
        c.len(),
        batch * m * n
    );
    let beta = if accumulate { T::ONE } else { T::ZERO };
    for i in 0..batch {
        let [la, lb, lc] = batch_item(ta, tb, [m, k, n], i);
        gemm(m, k, n, T::ONE, a, la, b, lb, beta, c, lc);
    }
}

/// The layouts of product `i` of a batch `[batch, m, k] × [batch, k, n] → [batch, m, n]`: `A`
/// and `B` stored as `ta` and `tb` say, `C` row-major, each at its item's offset. Both batched
/// products ([`batched_matmul`] and [`super::gemm::batched_matmul_ws`]) walk their batch so.
pub(crate) fn batch_item(ta: Trans, tb: Trans, [m, k, n]: [usize; 3], i: usize) -> [MatLayout; 3] {
    [
        MatLayout::stored(ta, m, k).at(i * m * k),
        MatLayout::stored(tb, k, n).at(i * k * n),
        MatLayout::row_major(n).at(i * m * n),
    ]
}

/// The batched row-major product `[batch, m, k] × [batch, k, n] → [batch, m, n]`, overwriting `c`.
///
/// # Panics
/// If a slice does not have exactly the length its shape needs.
pub fn matmul<T: GemmScalar>(
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
    c: &mut [T],
) {
    batched_matmul(batch, m, k, n, a, Trans::N, b, Trans::N, c, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook triple loop, in f64.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        batch: usize,
        m: usize,
        k: usize,
        n: usize,
        a: &[f64],
        ta: Trans,
        b: &[f64],
        tb: Trans,
    ) -> Vec<f64> {
        let mut c = vec![0.0; batch * m * n];
        for bi in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0;
                    for p in 0..k {
                        let av = match ta {
                            Trans::N => a[bi * m * k + i * k + p],
                            Trans::T => a[bi * m * k + p * m + i],
                        };
                        let bv = match tb {
                            Trans::N => b[bi * k * n + p * n + j],
                            Trans::T => b[bi * k * n + j * k + p],
                        };
                        s += av * bv;
                    }
                    c[bi * m * n + i * n + j] = s;
                }
            }
        }
        c
    }

    fn data(len: usize, seed: u64) -> Vec<f64> {
        let mut next = crate::fused::random::xorshift(seed);
        // Small integers: every product and sum is exact in f32 and f64.
        (0..len)
            .map(|_| ((next() >> 40) % 9) as f64 - 4.0)
            .collect()
    }

    #[test]
    fn batched_matmul_matches_the_triple_loop_for_every_transpose_combination() {
        for &(batch, m, k, n) in &[
            (1, 1, 1, 1),
            (3, 5, 7, 2),
            (2, 17, 33, 9),
            (1, 70, 130, 65),
            (2, 4, 0, 3),
            (1, 0, 3, 4),
        ] {
            for ta in [Trans::N, Trans::T] {
                for tb in [Trans::N, Trans::T] {
                    let a = data(batch * m * k, 1);
                    let b = data(batch * k * n, 2);
                    let want = naive(batch, m, k, n, &a, ta, &b, tb);
                    let mut c64 = vec![f64::NAN; batch * m * n];
                    batched_matmul(batch, m, k, n, &a, ta, &b, tb, &mut c64, false);
                    assert_eq!(c64, want, "f64 {batch}x{m}x{k}x{n} {ta:?}{tb:?}");
                    let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
                    let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
                    let mut c32 = vec![f32::NAN; batch * m * n];
                    batched_matmul(batch, m, k, n, &a32, ta, &b32, tb, &mut c32, false);
                    let c32: Vec<f64> = c32.iter().map(|&v| v as f64).collect();
                    assert_eq!(c32, want, "f32 {batch}x{m}x{k}x{n} {ta:?}{tb:?}");
                }
            }
        }
    }

    #[test]
    fn accumulating_adds_the_product_to_c() {
        let (m, k, n) = (6, 5, 4);
        let a = data(m * k, 3);
        let b = data(k * n, 4);
        let mut c = data(m * n, 5);
        let want: Vec<f64> = naive(1, m, k, n, &a, Trans::N, &b, Trans::N)
            .iter()
            .zip(&c)
            .map(|(p, c)| p + c)
            .collect();
        batched_matmul(1, m, k, n, &a, Trans::N, &b, Trans::N, &mut c, true);
        assert_eq!(c, want);
    }

    #[test]
    fn gemm_reads_and_writes_strided_submatrices_in_place() {
        // A is the 3x4 block at rows 1.., cols 2.. of a 5x8 matrix; B is read transposed from a
        // 6x4 row-major buffer; C is written as columns of a 10x3 buffer.
        let (m, k, n) = (3, 4, 6);
        let big_a = data(5 * 8, 6);
        let bt = data(n * k, 7);
        let la = MatLayout {
            offset: 8 + 2,
            row_stride: 8,
            col_stride: 1,
        };
        let lb = MatLayout::col_major(k);
        let lc = MatLayout {
            offset: 0,
            row_stride: 1,
            col_stride: 3,
        };
        let mut c = vec![0.0; 3 * n];
        gemm(m, k, n, 2.0, &big_a, la, &bt, lb, 0.0, &mut c, lc);
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|p| big_a[10 + i * 8 + p] * bt[j * k + p]).sum();
                assert_eq!(c[j * 3 + i], 2.0 * s);
            }
        }
    }

    #[test]
    fn threaded_products_are_bit_identical_run_to_run() {
        let (m, k, n) = (300, 200, 250);
        let a: Vec<f32> = data(m * k, 8).iter().map(|&v| (v * 0.37) as f32).collect();
        let b: Vec<f32> = data(k * n, 9).iter().map(|&v| (v * 1.13) as f32).collect();
        let mut first = vec![0f32; m * n];
        matmul(1, m, k, n, &a, &b, &mut first);
        for _ in 0..5 {
            let mut again = vec![0f32; m * n];
            matmul(1, m, k, n, &a, &b, &mut again);
            assert!(first
                .iter()
                .zip(&again)
                .all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    #[test]
    #[should_panic(expected = "reads index")]
    fn a_layout_outside_its_slice_is_refused() {
        let a = [1.0f32; 4];
        let mut c = [0.0f32; 4];
        gemm(
            2,
            2,
            2,
            1.0,
            &a,
            MatLayout::row_major(3),
            &a,
            MatLayout::row_major(2),
            0.0,
            &mut c,
            MatLayout::row_major(2),
        );
    }
}
