//! The element types the numeric kernels are generic over, and the arithmetic they need.
//!
//! Integer arithmetic wraps (two's complement), so that no input makes a kernel panic, in debug
//! builds included. Float `max` and `min` propagate NaN (a NaN operand gives NaN), as PyTorch's
//! `maximum`/`minimum` and XLA's `max`/`min` do: unlike [`f32::max`], which ignores a NaN
//! operand, so that a model whose weights hold NaN would otherwise report a finite loss
//! through a ReLU.

/// A numeric element: `f32`, `f64`, `i32` or `i64`.
pub trait Scalar: Copy + PartialOrd + Send + Sync + std::fmt::Debug + 'static {
    /// The identity of `add`.
    const ZERO: Self;
    /// The identity of `max`: negative infinity for floats, the minimum for integers.
    const LOWEST: Self;
    /// Sum; wrapping for integers.
    fn add(self, other: Self) -> Self;
    /// Larger of the two; for floats NaN if either operand is NaN.
    fn max(self, other: Self) -> Self;
    /// Whether this is a float NaN (never for integers).
    fn is_nan(self) -> bool;
}

macro_rules! float_scalar {
    ($t:ty) => {
        impl Scalar for $t {
            const ZERO: Self = 0.0;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self + other
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                let m = <$t>::max(self, other);
                if self.is_nan() || other.is_nan() {
                    self + other
                } else {
                    m
                }
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}

macro_rules! int_scalar {
    ($t:ty) => {
        impl Scalar for $t {
            const ZERO: Self = 0;
            const LOWEST: Self = <$t>::MIN;
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                false
            }
        }
    };
}

float_scalar!(f32);
float_scalar!(f64);
int_scalar!(i32);
int_scalar!(i64);

/// The rest of the arithmetic of the numeric dtypes, as the IR's elementwise ops define it:
/// integers wrap, float `min` propagates NaN (as `max` does, see [`Scalar::max`]). The unfused executor and
/// the fused kernels both compute through these, so they mean the same thing.
pub trait Num: Scalar {
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn neg(self) -> Self;
}

/// The float-only ops.
pub trait Float: Num {
    fn div(self, o: Self) -> Self;
    /// For f32 [`exp_f32`](super::exp::exp_f32) (branch-free, within 1 ulp), for f64 std's:
    /// one f32 exp for every CPU path (unfused ops, fused kernels, attention, constant folding),
    /// so a value computed fused and unfused has the same bits.
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    /// For f32 [`tanh_f32`](super::tanh::tanh_f32) (branch-free, so loops over lanes
    /// vectorise), for f64 std's.
    fn tanh(self) -> Self;
    fn recip(self) -> Self;
    /// The error function (libm's, as CUDA's `erff`/`erf` compute it to within an ulp or two).
    fn erf(self) -> Self;
}

macro_rules! float_num {
    ($t:ty, $exp:path, $tanh:path) => {
        impl Num for $t {
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                let m = <$t>::min(self, o);
                if self.is_nan() || o.is_nan() {
                    self + o
                } else {
                    m
                }
            }
            #[inline(always)]
            fn neg(self) -> Self {
                -self
            }
        }
        impl Float for $t {
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self / o
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $tanh(self)
            }
            #[inline(always)]
            fn recip(self) -> Self {
                1.0 / self
            }
            #[inline(always)]
            fn erf(self) -> Self {
                erf_of(self)
            }
        }
    };
}

/// libm's erf of each float width (std has none on stable).
trait ErfOf {
    fn erf_of(self) -> Self;
}
impl ErfOf for f32 {
    fn erf_of(self) -> f32 {
        libm::erff(self)
    }
}
impl ErfOf for f64 {
    fn erf_of(self) -> f64 {
        libm::erf(self)
    }
}
fn erf_of<T: ErfOf>(x: T) -> T {
    x.erf_of()
}
float_num!(f32, super::exp::exp_f32, super::tanh::tanh_f32);
float_num!(f64, f64::exp, f64::tanh);

macro_rules! int_num {
    ($t:ty) => {
        impl Num for $t {
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline(always)]
            fn neg(self) -> Self {
                self.wrapping_neg()
            }
        }
    };
}
int_num!(i32);
int_num!(i64);

#[cfg(test)]
mod tests {
    use super::Float;

    #[test]
    fn erf_matches_tabulated_values_in_both_widths() {
        // erf to 16 digits (Abramowitz & Stegun's table, extended): odd, 0 at 0, → ±1.
        let table: [(f64, f64); 8] = [
            (0.0, 0.0),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (1.5, 0.9661051464753108),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (6.0, 1.0),
        ];
        for (x, want) in table {
            for s in [1.0f64, -1.0] {
                let (x, want) = (s * x, s * want);
                assert!(
                    (Float::erf(x) - want).abs() <= 2e-16,
                    "erf({x}) = {}",
                    Float::erf(x)
                );
                let got32 = Float::erf(x as f32) as f64;
                assert!((got32 - want).abs() <= 2e-7, "erff({x}) = {got32}");
            }
        }
        assert!(Float::erf(f64::NAN).is_nan());
    }
}
