//! Element types. Floats carry training math, integers carry token and class ids,
//! booleans carry masks from comparisons.
//!
//! `bf16` is a storage type: every op on it computes in f32 and rounds the result to the nearest
//! bf16, ties to even, when it is stored ([`round_bf16`]), as the GPU does. A bf16 value therefore
//! always equals the f32 it widens to, and an executor may keep it as that f32 between ops so
//! long as it rounds after each op whose result is bf16.

/// The bf16 storage type (from `half`, re-exported so that every crate names the same type).
pub use half::bf16;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    F32,
    /// Used by gradient checks, where finite differences need the extra precision.
    F64,
    I32,
    I64,
    /// One byte per element; produced by comparisons, consumed by `select`.
    Bool,
    /// bfloat16: f32's sign and exponent, 7 mantissa bits. Mixed-precision storage (see the
    /// module docs); arithmetic on it is f32 arithmetic, rounded on store.
    BF16,
}

/// The bf16 nearest to `x`, ties to even (NaN stays NaN, quieted): what every store of a bf16
/// value computes. `half`'s conversion is this rounding; the tests check it against an
/// independent bit-level reference, ties included.
#[inline(always)]
pub fn round_bf16(x: f32) -> half::bf16 {
    half::bf16::from_f32(x)
}

/// The bf16 nearest to `x`, ties to even, rounded once (NaN stays NaN): what `full` and
/// `convert` from f64 give. `half`'s own `bf16::from_f64` drops the low 32 bits of `x` first,
/// which misrounds values just above a tie; here `x` goes to f32 rounded *to odd* (truncated
/// toward zero, the last bit set when anything was dropped), which keeps enough information
/// for the one correct rounding to bf16 that follows (f32 has 16 more significand bits than
/// bf16, and round-to-odd is exact for a later rounding to at least 2 fewer bits).
pub fn bf16_from_f64(x: f64) -> half::bf16 {
    let f = x as f32;
    if x.is_nan() || f as f64 == x {
        return round_bf16(f);
    }
    let mut bits = f.to_bits();
    if (f as f64).abs() > x.abs() {
        // Rounded away from zero (possibly to infinity): step back toward zero.
        bits -= 1;
    }
    round_bf16(f32::from_bits(bits | 1))
}

/// `x` rounded to bf16 and widened back: the f32 an executor keeps for a bf16 value.
#[inline(always)]
pub fn quantize_bf16(x: f32) -> f32 {
    round_bf16(x).to_f32()
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::BF16,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool => 1,
            DType::BF16 => 2,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::BF16 => "bf16",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
