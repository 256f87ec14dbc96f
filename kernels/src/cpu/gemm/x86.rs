//! The x86-64 micro-kernels (AVX2+FMA and AVX-512) and the AVX transposing packers.

use super::kernel::{pack_lines_scalar, Kernel};
use std::arch::x86_64::*;

/// Defines a SIMD micro-kernel for a `$tile = (MR, NR)` tile, rows of vectors of `$lanes` lanes, under
/// `#[target_feature(enable = $feat)]`, from the given intrinsics.
macro_rules! simd_kernel {
    (
        $name:ident, $fname:ident, $feat:literal, $t:ty, $v:ty, $lanes:literal, $tile:expr,
        zero = $zero:ident, set1 = $set1:ident, load = $load:ident, store = $store:ident,
        fmadd = $fmadd:ident, mul = $mul:ident, pack = $pack:expr
    ) => {
        pub(super) struct $name;

        impl Kernel<$t> for $name {
            const MR: usize = $tile.0;
            const NR: usize = $tile.1;
            #[inline(always)]
            unsafe fn tile(
                kc: usize,
                a: *const $t,
                b: *const $t,
                c: *mut $t,
                rsc: usize,
                csc: usize,
                mr: usize,
                nr: usize,
                alpha: $t,
                beta: $t,
            ) {
                $fname(kc, a, b, c, rsc, csc, mr, nr, alpha, beta)
            }
            #[inline(always)]
            unsafe fn pack_lines(
                src: *const $t,
                ld: usize,
                w: usize,
                kc: usize,
                dst: *mut $t,
                p: usize,
            ) {
                $pack(src, ld, w, kc, dst, p)
            }
        }

        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $fname(
            kc: usize,
            mut a: *const $t,
            mut b: *const $t,
            c: *mut $t,
            rsc: usize,
            csc: usize,
            mr: usize,
            nr: usize,
            alpha: $t,
            beta: $t,
        ) {
            const MR: usize = $tile.0;
            const L: usize = $lanes;
            const NV: usize = $tile.1 / L;
            const _: () = assert!(NV * L == $tile.1, "NR must be a multiple of the lanes");
            let mut acc = [[$zero(); NV]; MR];
            for _ in 0..kc {
                let mut bv = [$zero(); NV];
                for v in 0..NV {
                    bv[v] = $load(b.add(v * L));
                }
                for i in 0..MR {
                    let av = $set1(*a.add(i));
                    for v in 0..NV {
                        acc[i][v] = $fmadd(av, bv[v], acc[i][v]);
                    }
                }
                a = a.add(MR);
                b = b.add(NV * L);
            }
            let alphav = $set1(alpha);
            if mr == MR && nr == NV * L && csc == 1 {
                if beta == 0.0 {
                    for i in 0..MR {
                        for v in 0..NV {
                            $store(c.add(i * rsc + v * L), $mul(alphav, acc[i][v]));
                        }
                    }
                } else {
                    let betav = $set1(beta);
                    for i in 0..MR {
                        for v in 0..NV {
                            let cp = c.add(i * rsc + v * L);
                            let cv = $mul($load(cp), betav);
                            $store(cp, $fmadd(alphav, acc[i][v], cv));
                        }
                    }
                }
            } else {
                // A partial tile or strided C: the same arithmetic on vectors, moved through
                // a buffer on the stack.
                let mut buf = [[0.0 as $t; $tile.1]; MR];
                for i in 0..MR {
                    for v in 0..NV {
                        $store(buf[i].as_mut_ptr().add(v * L), acc[i][v]);
                    }
                }
                let betav = $set1(beta);
                for (i, row) in buf.iter().enumerate().take(mr) {
                    let mut cr = [0.0 as $t; $tile.1];
                    if beta != 0.0 {
                        for j in 0..nr {
                            cr[j] = *c.add(i * rsc + j * csc);
                        }
                    }
                    for v in 0..NV {
                        let s = $load(row.as_ptr().add(v * L));
                        let r = if beta == 0.0 {
                            $mul(alphav, s)
                        } else {
                            $fmadd(alphav, s, $mul($load(cr.as_ptr().add(v * L)), betav))
                        };
                        $store(cr.as_mut_ptr().add(v * L), r);
                    }
                    for j in 0..nr {
                        *c.add(i * rsc + j * csc) = cr[j];
                    }
                }
            }
        }
    };
}

simd_kernel!(
    Avx512F32,
    avx512_f32,
    "avx512f",
    f32,
    __m512,
    16,
    super::kernel::AVX512_F32,
    zero = _mm512_setzero_ps,
    set1 = _mm512_set1_ps,
    load = _mm512_loadu_ps,
    store = _mm512_storeu_ps,
    fmadd = _mm512_fmadd_ps,
    mul = _mm512_mul_ps,
    pack = pack_lines_avx
);
simd_kernel!(
    Avx512F64,
    avx512_f64,
    "avx512f",
    f64,
    __m512d,
    8,
    super::kernel::AVX512_F64,
    zero = _mm512_setzero_pd,
    set1 = _mm512_set1_pd,
    load = _mm512_loadu_pd,
    store = _mm512_storeu_pd,
    fmadd = _mm512_fmadd_pd,
    mul = _mm512_mul_pd,
    pack = super::kernel::pack_lines_scalar::<f64>
);
simd_kernel!(
    Avx2F32,
    avx2_f32,
    "avx2,fma",
    f32,
    __m256,
    8,
    super::kernel::AVX2_F32,
    zero = _mm256_setzero_ps,
    set1 = _mm256_set1_ps,
    load = _mm256_loadu_ps,
    store = _mm256_storeu_ps,
    fmadd = _mm256_fmadd_ps,
    mul = _mm256_mul_ps,
    pack = pack_lines_avx
);
simd_kernel!(
    Avx2F64,
    avx2_f64,
    "avx2,fma",
    f64,
    __m256d,
    4,
    super::kernel::AVX2_F64,
    zero = _mm256_setzero_pd,
    set1 = _mm256_set1_pd,
    load = _mm256_loadu_pd,
    store = _mm256_storeu_pd,
    fmadd = _mm256_fmadd_pd,
    mul = _mm256_mul_pd,
    pack = super::kernel::pack_lines_scalar::<f64>
);

/// [`Kernel::pack_lines`] for f32 with AVX: blocks of 8 lines × 8 elements are transposed
/// in registers (unpack, shuffle, permute), the rest one element at a time.
///
/// # Safety
/// As [`Kernel::pack_lines`], and the CPU has AVX.
#[target_feature(enable = "avx")]
unsafe fn pack_lines_avx(src: *const f32, ld: usize, w: usize, kc: usize, dst: *mut f32, p: usize) {
    let (w8, kc8) = (w / 8 * 8, kc / 8 * 8);
    let mut j = 0;
    while j < w8 {
        let l = src.add(j * ld);
        let mut q = 0;
        while q < kc8 {
            let r = |t: usize| _mm256_loadu_ps(l.add(t * ld + q));
            let (r0, r1, r2, r3) = (r(0), r(1), r(2), r(3));
            let (r4, r5, r6, r7) = (r(4), r(5), r(6), r(7));
            // tN: pairs of lines interleaved; uN: four lines, elements q+u | q+4+u.
            let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
            let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
            let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
            let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let d = dst.add(q * p + j);
            _mm256_storeu_ps(d, _mm256_permute2f128_ps::<0x20>(u0, u4));
            _mm256_storeu_ps(d.add(p), _mm256_permute2f128_ps::<0x20>(u1, u5));
            _mm256_storeu_ps(d.add(2 * p), _mm256_permute2f128_ps::<0x20>(u2, u6));
            _mm256_storeu_ps(d.add(3 * p), _mm256_permute2f128_ps::<0x20>(u3, u7));
            _mm256_storeu_ps(d.add(4 * p), _mm256_permute2f128_ps::<0x31>(u0, u4));
            _mm256_storeu_ps(d.add(5 * p), _mm256_permute2f128_ps::<0x31>(u1, u5));
            _mm256_storeu_ps(d.add(6 * p), _mm256_permute2f128_ps::<0x31>(u2, u6));
            _mm256_storeu_ps(d.add(7 * p), _mm256_permute2f128_ps::<0x31>(u3, u7));
            q += 8;
        }
        // The last kc % 8 elements of these 8 lines.
        pack_lines_scalar(l.add(kc8), ld, 8, kc - kc8, dst.add(kc8 * p + j), p);
        j += 8;
    }
    // The last w % 8 lines.
    pack_lines_scalar(src.add(w8 * ld), ld, w - w8, kc, dst.add(w8), p);
}
