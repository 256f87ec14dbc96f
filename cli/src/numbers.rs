//! Every number the command line takes is range-checked here, when it is parsed, before
//! anything uses it: a learning rate that is not finite, a momentum of 1, a budget beyond the
//! address space or a count that would wrap are usage errors (exit 2) naming the flag, never
//! an infinite step size or a plan for more bytes than a pointer can hold.
//!
//! Each function is a clap `value_parser`; the flags that take negative-looking values say
//! `allow_hyphen_values` so that `--lr -1` reaches the parser and is refused with the reason.

/// The most bytes a size may name: the address space a pointer can index (`isize::MAX`, which
/// Rust's allocations cannot pass either).
pub const MAX_BYTES: u64 = isize::MAX as u64;

/// The largest count a count flag takes (steps, warmup steps, batches): 2^53, so that a count
/// converts to f64 exactly (schedules compute with it) and `count + 1` cannot wrap.
pub const MAX_COUNT: u64 = 1 << 53;

fn number(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .map_err(|_| format!("{s:?} is not a number"))
}

/// A finite number above 0 (a learning rate, AdamW's eps, a clipping norm).
pub fn positive(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(format!("{s} is not a finite number above 0"))
    }
}

/// A finite number at least 0 (a weight decay).
pub fn non_negative(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(format!("{s} is not a finite number of at least 0"))
    }
}

/// A number in [0, 1) (a momentum, one of AdamW's betas: 1 would never forget).
pub fn below_one(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if (0.0..1.0).contains(&x) {
        Ok(x)
    } else {
        Err(format!("{s} is not in [0, 1)"))
    }
}

/// A number in [0, 1] (a ratio).
pub fn unit(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if (0.0..=1.0).contains(&x) {
        Ok(x)
    } else {
        Err(format!("{s} is not in [0, 1]"))
    }
}

/// A count from 0 to [`MAX_COUNT`].
pub fn count(s: &str) -> Result<u64, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number of at least 0"))?;
    if n > MAX_COUNT {
        return Err(format!(
            "{n} is more than the {MAX_COUNT} (2^53) a count may be"
        ));
    }
    Ok(n)
}

/// A count from 1 to [`MAX_COUNT`].
pub fn positive_count(s: &str) -> Result<u64, String> {
    match count(s)? {
        0 => Err("0: at least 1 is needed".into()),
        n => Ok(n),
    }
}

/// A size in bytes (`16GiB`, `512MiB`, `1000000`), at most [`MAX_BYTES`].
pub fn size(s: &str) -> Result<usize, String> {
    let n = ingot_compiler::report::parse_size(s)?;
    if n as u64 > MAX_BYTES {
        return Err(format!(
            "{s} is {n} bytes, beyond the address space ({MAX_BYTES} bytes at most)"
        ));
    }
    Ok(n)
}

/// AdamW's betas, `B1,B2` (parsed as the compiler parses them), each in [0, 1).
pub fn betas(s: &str) -> Result<(f64, f64), String> {
    let (b1, b2) = ingot_compiler::autodiff::optim::parse_betas(s)?;
    let one = |x: f64, which: &str| {
        if (0.0..1.0).contains(&x) {
            Ok(x)
        } else {
            Err(format!("{which}: {x} is not in [0, 1)"))
        }
    };
    Ok((one(b1, "B1")?, one(b2, "B2")?))
}

/// Per-channel values R,G,B (`--image-mean`, `--image-std`): three finite numbers, or one for
/// all three. `positive` also refuses values at or below 0 (a standard deviation).
fn channels(s: &str, positive: bool) -> Result<[f32; 3], String> {
    let values: Vec<f64> = s.split(',').map(number).collect::<Result<_, _>>()?;
    for &v in &values {
        let ok = v.is_finite() && (!positive || v > 0.0) && (v as f32).is_finite();
        if !ok {
            return Err(format!(
                "{v} is not a finite number{}",
                if positive { " above 0" } else { "" }
            ));
        }
    }
    match values[..] {
        [v] => Ok([v as f32; 3]),
        [r, g, b] => Ok([r as f32, g as f32, b as f32]),
        _ => Err(format!(
            "{s:?}: give three values R,G,B (e.g. 0.485,0.456,0.406) or one for every channel"
        )),
    }
}

/// `--image-mean`: R,G,B or one value.
pub fn image_mean(s: &str) -> Result<[f32; 3], String> {
    channels(s, false)
}

/// `--image-std`: R,G,B or one value, each above 0.
pub fn image_std(s: &str) -> Result<[f32; 3], String> {
    channels(s, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learning_rate_that_is_not_a_finite_positive_number_is_refused() {
        for bad in [
            "nan", "NaN", "inf", "-inf", "1e999", "0", "-0.1", "-1", "x", "",
        ] {
            assert!(positive(bad).is_err(), "{bad:?} was taken");
        }
        assert_eq!(positive("1e-3"), Ok(1e-3));
        assert_eq!(positive(" 0.5 "), Ok(0.5));
    }

    #[test]
    fn momentum_and_betas_are_below_one_and_weight_decay_not_negative() {
        assert!(below_one("1").is_err() && below_one("-0.1").is_err() && below_one("nan").is_err());
        assert_eq!(below_one("0"), Ok(0.0));
        assert!(non_negative("-1e-9").is_err() && non_negative("inf").is_err());
        assert_eq!(non_negative("0"), Ok(0.0));
        assert_eq!(betas("0.9,0.95"), Ok((0.9, 0.95)));
        let e = betas("0.9,1").unwrap_err();
        assert!(e.contains("B2") && e.contains("[0, 1)"), "{e}");
        assert!(betas("0.9").is_err() && betas("nan,0.9").is_err());
        assert!(unit("1").is_ok() && unit("1.01").is_err() && unit("nan").is_err());
    }

    #[test]
    fn a_count_that_would_wrap_or_lose_precision_is_refused() {
        let e = count("18446744073709551615").unwrap_err();
        assert!(e.contains("2^53"), "{e}");
        assert_eq!(count(&MAX_COUNT.to_string()), Ok(MAX_COUNT));
        assert!(count(&(MAX_COUNT + 1).to_string()).is_err());
        assert!(count("-1").is_err() && count("1.5").is_err());
        assert!(positive_count("0").is_err());
        assert_eq!(positive_count("3"), Ok(3));
    }

    #[test]
    fn a_size_beyond_the_address_space_is_refused_naming_it() {
        let e = size("99999999999999999999999999").unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        assert!(size("1e30GiB").is_err());
        let e = size("9000000TiB").unwrap_err();
        assert!(e.contains("address space"), "{e}");
        assert_eq!(size("16GiB"), Ok(16 << 30));
    }

    #[test]
    fn image_means_and_deviations_take_three_values_or_one() {
        assert_eq!(image_mean("0.5,0.25,0"), Ok([0.5, 0.25, 0.0]));
        assert_eq!(image_std("0.5"), Ok([0.5; 3]));
        for bad in ["0.1,0.2", "x", "1,2,3,4", "nan", ""] {
            assert!(image_mean(bad).is_err(), "{bad:?} was taken");
        }
        for bad in ["0", "0.2,-1,0.2", "inf"] {
            assert!(image_std(bad).is_err(), "{bad:?} was taken");
        }
    }
}
