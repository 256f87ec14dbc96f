//! The element types the numeric kernels are generic over, and the arithmetic they need.
//!
//! Integer arithmetic wraps (two's complement), so that no input makes a kernel panic, in debug
//! builds included. Float `max` follows [`f32::max`]: a NaN operand is ignored unless both are NaN.

/// A numeric element: `f32`, `f64`, `i32` or `i64`.
pub trait Scalar: Copy + PartialOrd + Send + Sync + std::fmt::Debug + 'static {
    /// The identity of `add`.
    const ZERO: Self;
    /// The identity of `max`: negative infinity for floats, the minimum for integers.
    const LOWEST: Self;
    /// Sum; wrapping for integers.
    fn add(self, other: Self) -> Self;
    /// Larger of the two; for floats a NaN operand is ignored (as in [`f32::max`]).
    fn max(self, other: Self) -> Self;
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
                <$t>::max(self, other)
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
        }
    };
}

float_scalar!(f32);
float_scalar!(f64);
int_scalar!(i32);
int_scalar!(i64);
