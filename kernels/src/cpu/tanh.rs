//! The f32 hyperbolic tangent every CPU path computes (the fused kernels, compiled and
//! interpreted, the unfused executor, the bf16 ops and the compiler's constant folding).
//!
//! # Why not libm's
//! GELU's tanh was a quarter of the README's main job on the CPU (issue 49): glibc's `tanhf`
//! branches on the argument's range and calls `expm1f`, so a loop over a chunk of lanes calls
//! it once a lane. [`tanh_f32`] has no branches and no calls: both of its formulas are
//! computed for every lane and one is selected, so the compiler vectorises a loop over lanes
//! (the compiled fused kernels' loops), and it is about six times faster than `tanhf` there.
//! Because every CPU path calls this one function, the interpreter and the compiled kernels
//! keep the same bits. The CUDA kernels call CUDA's `tanhf` as before.
//!
//! # Accuracy
//! At most 1.33 ulp from the exactly rounded value over every finite f32 (checked exhaustively
//! when it was written; the tests sweep every 509th bit pattern and hold it to 1.5 ulp), against
//! glibc's 2.1 ulp by the same measure. Odd; `tanh(±0) = ±0`, tiny arguments are returned
//! unchanged, `tanh(±inf) = ±1`, arguments beyond ±9.02 give ±1 (as the rounded value is), and
//! NaN gives NaN.
//!
//! # How
//! Cephes' `tanhf` (S. L. Moshier), made branch-free: below 0.625 an odd polynomial
//! `a + a³·P(a²)` (relative error 1.3e-7 on that range), above it `1 − 2/(e^{2a} + 1)` with
//! the branch-free [`exp_f32`](super::exp::exp_f32) and `a` clamped to 10.

/// `tanh(x)` in f32 within 1.3 ulp, branch-free (see the [module docs](self)).
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let s = a * a;
    let small =
        ((((-5.704_988_7e-3 * s + 2.063_909e-2) * s - 5.373_971_6e-2) * s + 1.333_144_2e-1) * s
            - 3.333_328e-1)
            * s
            * a
            + a;
    // Clamped so that e^{2a} stays finite; NaN compares false and is replaced too (NaN is
    // restored at the end). tanh(10) rounds to 1 as tanh of anything larger does.
    let c = if a < 10.0 { a } else { 10.0 };
    let large = 1.0 - 2.0 / (super::exp::exp_f32(c + c) + 1.0);
    let r = if a < 0.625 { small } else { large };
    if x.is_nan() {
        x
    } else {
        r.copysign(x)
    }
}

#[cfg(test)]
mod tests {
    use super::tanh_f32;

    /// Distance from `want` (exact, in f64) to `got`, in units of f32's spacing at `want`.
    fn ulps(got: f32, want: f64) -> f64 {
        let w = (want as f32).abs();
        let ulp = if w == 0.0 {
            f32::from_bits(1) as f64
        } else if w.to_bits() >= 0x7f7f_ffff {
            (f32::MAX as f64) - (f32::from_bits(0x7f7f_fffe) as f64)
        } else {
            f32::from_bits(w.to_bits() + 1) as f64 - w as f64
        };
        (got as f64 - want).abs() / ulp
    }

    #[test]
    fn tanh_is_within_one_and_a_half_ulp_of_f64s_over_the_whole_f32_range() {
        let mut worst = (0.0f64, 0.0f32);
        let mut bits: u32 = 0;
        while bits < 0x7f80_0000 {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let u = ulps(tanh_f32(x), (x as f64).tanh());
                if u > worst.0 {
                    worst = (u, x);
                }
            }
            bits += 509;
        }
        assert!(worst.0 <= 1.5, "tanh({:e}) is {} ulp off", worst.1, worst.0);
    }

    #[test]
    fn tanh_keeps_the_edges_zero_tiny_large_infinite_and_nan() {
        for x in [
            0.0f32,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(1),
            1e-30,
            -1e-30,
            1e-4,
        ] {
            assert_eq!(tanh_f32(x).to_bits(), x.to_bits(), "tanh({x:e})");
        }
        for (x, want) in [
            (9.02f32, 1.0f32),
            (10.0, 1.0),
            (1e30, 1.0),
            (f32::MAX, 1.0),
            (f32::INFINITY, 1.0),
        ] {
            assert_eq!(tanh_f32(x), want, "tanh({x:e})");
            assert_eq!(tanh_f32(-x), -want, "tanh({:e})", -x);
        }
        // Just below 1: the last argument whose tanh does not round to 1.
        assert_eq!(tanh_f32(9.0), 1.0 - f32::EPSILON / 2.0);
        assert!(tanh_f32(f32::NAN).is_nan());
        assert!(tanh_f32(-f32::NAN).is_nan());
        // Both sides of the switch between the two formulas, and odd.
        for x in [0.624_999_94f32, 0.625, 0.625_000_06, 1.0, 3.0] {
            assert!(ulps(tanh_f32(x), (x as f64).tanh()) <= 1.5, "tanh({x})");
            assert_eq!(tanh_f32(-x), -tanh_f32(x));
        }
    }
}
