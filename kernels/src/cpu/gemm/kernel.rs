//! The micro-kernel interface every GEMM kernel implements ([`Kernel`]), the tile shapes of
//! the kernels, and the scalar transposing packer.

/// Tile shapes `(MR, NR)` of the kernels (the portable one and the x86 ones).
pub(super) const AVX512_F32: (usize, usize) = (12, 32);
pub(super) const AVX512_F64: (usize, usize) = (12, 16);
pub(super) const AVX2_F32: (usize, usize) = (6, 16);
pub(super) const AVX2_F64: (usize, usize) = (6, 8);
pub(super) const PORTABLE_F32: (usize, usize) = (4, 8);
pub(super) const PORTABLE_F64: (usize, usize) = (4, 4);

/// A micro-kernel: `C[0..mr, 0..nr] ← α·(Ã·B̃) + β·C` for a packed `MR × kc` micro-panel `Ã`
/// (column after column, `MR` values each) and a packed `kc × NR` micro-panel `B̃` (row after
/// row, `NR` values each), where only the `mr × nr` corner of the tile is inside `C`.
pub(super) trait Kernel<E: Copy> {
    const MR: usize;
    const NR: usize;
    /// # Safety
    /// `a` and `b` point to `MR·kc` and `kc·NR` readable elements, `kc > 0`, `mr ≤ MR`,
    /// `nr ≤ NR`, and `c + i·rsc + j·csc` is a writable element of C for `i < mr`, `j < nr`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        kc: usize,
        a: *const E,
        b: *const E,
        c: *mut E,
        rsc: usize,
        csc: usize,
        mr: usize,
        nr: usize,
        alpha: E,
        beta: E,
    );

    /// Packs `w` contiguous lines of `kc` elements (line `j` at `src + j·ld`) into the
    /// interleaved layout of a micro-panel of width `p`: `dst[q·p + j] = line_j[q]`. This is the
    /// transposing case of packing (rows of a row-major A, columns of a transposed B).
    ///
    /// # Safety
    /// The lines are readable, `dst` has room for `kc·p` elements, `w ≤ p`.
    #[inline(always)]
    unsafe fn pack_lines(src: *const E, ld: usize, w: usize, kc: usize, dst: *mut E, p: usize) {
        pack_lines_scalar(src, ld, w, kc, dst, p)
    }
}

/// [`Kernel::pack_lines`] one element at a time.
///
/// # Safety
/// As [`Kernel::pack_lines`].
pub(super) unsafe fn pack_lines_scalar<E: Copy>(
    src: *const E,
    ld: usize,
    w: usize,
    kc: usize,
    dst: *mut E,
    p: usize,
) {
    for j in 0..w {
        let line = src.add(j * ld);
        for q in 0..kc {
            *dst.add(q * p + j) = *line.add(q);
        }
    }
}
