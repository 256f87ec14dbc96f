//! How a run's figures (losses, validation losses, means) are printed: [`Figure`], one
//! `Display` for every place that prints one with a fixed number of digits, so that a value
//! that rounds to zero from below reads `0.000000`, not `-0.000000`.
//!
//! Why: a loss that has nearly reached its minimum can land a hair below zero in f32 (a large
//! MLP's mean squared error at step 2 was -8.3e-9 against NumPy's +8.3e-9), and Rust's `{:.6}`
//! keeps the sign of what it rounded away: a step line reading `loss -0.000000` looks like a
//! negative loss, which it is not to the digits shown. A value that does not round to zero
//! keeps its sign (`-0.000001` stays), and the JSON lines keep the exact number.

use std::fmt;

/// A figure printed with the precision and width of its format (`{:>12.6}`, `{:.4}`), as an
/// `f64` is, except that a value rounding to zero at that precision (or a negative zero, with
/// no precision) prints as positive zero. NaN and infinities print as they are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figure(pub f64);

impl fmt::Display for Figure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = if self.0 < 0.0 && rounds_to_zero(self.0, f.precision()) || self.0 == 0.0 {
            0.0
        } else {
            self.0
        };
        fmt::Display::fmt(&v, f)
    }
}

/// Whether `v` reads as zero with `precision` digits after the point (with none, whether it
/// is zero).
fn rounds_to_zero(v: f64, precision: Option<usize>) -> bool {
    match precision {
        Some(p) => format!("{:.*}", p, v.abs())
            .bytes()
            .all(|b| b == b'0' || b == b'.'),
        None => v == 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::Figure;

    #[test]
    fn a_loss_rounding_to_zero_from_below_prints_as_positive_zero() {
        assert_eq!(
            format!("{:.6}", -8.3e-9),
            "-0.000000",
            "what f64 alone prints"
        );
        assert_eq!(format!("{:.6}", Figure(-8.3e-9)), "0.000000");
        assert_eq!(format!("{:.6}", Figure(-0.0)), "0.000000");
        assert_eq!(format!("{}", Figure(-0.0)), "0");
        assert_eq!(format!("{:.4}", Figure(-4.9e-5)), "0.0000");
        // The width and alignment of the format are kept.
        assert_eq!(format!("{:>12.6}", Figure(-8.3e-9)), "    0.000000");
    }

    #[test]
    fn a_figure_that_does_not_round_to_zero_keeps_its_sign_and_digits() {
        assert_eq!(format!("{:.6}", Figure(-6e-7)), "-0.000001");
        assert_eq!(format!("{:.4}", Figure(-6e-5)), "-0.0001");
        assert_eq!(format!("{:>12.6}", Figure(-1.25)), "   -1.250000");
        assert_eq!(format!("{:.6}", Figure(1.234567)), "1.234567");
        assert_eq!(format!("{}", Figure(-3e-9)), "-0.000000003");
        assert_eq!(format!("{:.6}", Figure(f64::NAN)), "NaN");
        assert_eq!(format!("{:.2}", Figure(f64::NEG_INFINITY)), "-inf");
    }
}
