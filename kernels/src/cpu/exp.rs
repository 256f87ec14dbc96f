//! A branch-free f32 `e^x`, for the loops over many lanes that libm's `expf` would make scalar:
//! attention's softmax on the CPU ([`super::attention`]) and the `e^{2a}` inside
//! [`super::tanh::tanh_f32`].
//!
//! # Accuracy
//! At most 1 ulp from the exactly rounded value over every f32 (0.96 ulp measured over every
//! 97th bit pattern when it was written; the tests sweep every 509th and hold it to 1 ulp),
//! subnormal results included; libm's is correctly rounded in practice (0.5 ulp). `e^x` is
//! `+inf` from 88.73 (where the rounded value overflows), `0` below −103.98, `e^{±0} = 1`,
//! `e^{+inf} = +inf`, `e^{-inf} = 0`, NaN gives NaN.
//!
//! # How
//! Cephes' `expf` (S. L. Moshier), made branch-free: the argument is clamped to `[−104, 89]`,
//! written `k·ln 2 + r` with `k` rounded to the nearest integer (by adding and subtracting
//! 1.5·2²³, which leaves `k` in the low mantissa bits) and `ln 2` in two parts (Cody and
//! Waite) so that `r` is exact, `e^r` is a degree-7 polynomial on `|r| ≤ ln2/2`, and the result
//! is scaled by `2^k` as two powers of two built from exponent bits, so that one rounding
//! makes a subnormal result and `2^128` overflows to infinity.

/// `e^x` in f32 within 1 ulp, branch-free (see the [module docs](self)).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    // NaN compares false and is clamped too (and restored at the end).
    let c = if x < 89.0 { x } else { 89.0 };
    let c = if c > -104.0 { c } else { -104.0 };
    let t = c * std::f32::consts::LOG2_E + ROUND;
    let k = t - ROUND;
    // k in -150..=129, from the low bits of t.
    let n = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let r = c - k * 0.693_359_4 - k * -2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_6e-1)
        * r
        + 0.5;
    let e = p * (r * r) + r + 1.0;
    // 2^k = 2^(k/2) · 2^(k - k/2), each factor a normal f32 (exponents -75..=65).
    let n1 = n >> 1;
    let pow2 = |m: i32| f32::from_bits(((m + 127) as u32) << 23);
    let y = e * pow2(n1) * pow2(n - n1);
    if x.is_nan() {
        x
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::exp_f32;

    /// Distance from `want` (exact, in f64) to `got`, in units of f32's spacing at `want`.
    fn ulps(got: f32, want: f64) -> f64 {
        if want > f32::MAX as f64 {
            return if got == f32::INFINITY {
                0.0
            } else {
                f64::INFINITY
            };
        }
        let w = (want as f32).abs();
        let ulp = if w == 0.0 {
            f32::from_bits(1) as f64
        } else if w == f32::MAX {
            2f64.powi(104)
        } else {
            f32::from_bits(w.to_bits() + 1) as f64 - w as f64
        };
        (got as f64 - want).abs() / ulp
    }

    #[test]
    fn exp_is_within_one_ulp_of_f64s_over_the_whole_f32_range() {
        let mut worst = (0.0f64, 0.0f32);
        let mut bits: u64 = 0;
        while bits < 1 << 32 {
            let x = f32::from_bits(bits as u32);
            if !x.is_nan() {
                let u = ulps(exp_f32(x), (x as f64).exp());
                if u > worst.0 {
                    worst = (u, x);
                }
            }
            bits += 509;
        }
        assert!(worst.0 <= 1.0, "exp({:e}) is {} ulp off", worst.1, worst.0);
    }

    #[test]
    fn exp_keeps_the_edges_zero_overflow_underflow_infinite_and_nan() {
        for (x, want) in [
            (0.0f32, 1.0f32),
            (-0.0, 1.0),
            (88.72, 3.393_180_6e38),
            (88.723, f32::INFINITY),
            (1e30, f32::INFINITY),
            (f32::INFINITY, f32::INFINITY),
            (-103.9, f32::from_bits(1)),
            (-104.0, 0.0),
            (-1e30, 0.0),
            (f32::NEG_INFINITY, 0.0),
        ] {
            assert_eq!(exp_f32(x), want, "exp({x:e})");
        }
        assert!(exp_f32(f32::NAN).is_nan());
        // Subnormal results, one rounding each.
        for x in [-87.5f32, -90.0, -95.25, -100.0, -103.0] {
            assert!(ulps(exp_f32(x), (x as f64).exp()) <= 1.0, "exp({x})");
        }
    }
}
