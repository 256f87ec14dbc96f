//! The counter-based generator of dropout: a value of `(seed, salt, index)` computed where it
//! is used, with no stored random state, so a step can recompute a mask instead of keeping it
//! (the backward pass of dropout draws the forward pass's mask again) and a run repeats and
//! resumes from its seed alone.
//!
//! Each draw is splitmix64's output function over a counter: a dropout op's **key** mixes the
//! step's seed with the op's salt (a hash of the layer's name, so two layers of one shape draw
//! different masks), and element `i` draws `mix(key + (i + 1)·γ)`, the `i`-th output of
//! splitmix64 started at `key`. Its top 24 bits over `2^24` are a uniform float in `[0, 1)`,
//! exact in f32 (and in f64), so the CPU and the CUDA code (which spells the same arithmetic in
//! `unsigned long long`, see [`crate::cuda::dropout`]) draw the same bits.
//!
//! Dropout keeps element `i` when its draw is at least `p` (as f32): with probability `1 − p`
//! up to the 2^-24 grid.

/// splitmix64's increment, `2^64 / φ`.
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function (a bijection of `u64` with full avalanche).
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z ^= z >> 30;
    z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^= z >> 27;
    z = z.wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of one dropout op (`salt`) in one step (`seed`, the step's seed input as `u64`).
#[inline]
pub fn key(seed: u64, salt: u64) -> u64 {
    mix(seed ^ mix(salt.wrapping_add(GAMMA)))
}

/// Draw `index` under `key`: uniform on `[0, 1)` in steps of `2^-24`.
#[inline]
pub fn uniform(key: u64, index: u64) -> f32 {
    let h = mix(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA)));
    (h >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// Whether dropout with probability `p` keeps element `index` under `key`.
#[inline]
pub fn keeps(key: u64, index: u64, p: f32) -> bool {
    uniform(key, index) >= p
}

/// The factor a kept element is scaled by, `1 / (1 − p)` (0 when `p` is 1: every element is
/// dropped).
pub fn keep_scale(p: f64) -> f64 {
    if p >= 1.0 {
        0.0
    } else {
        1.0 / (1.0 - p)
    }
}

/// Dropout of `x` into `out` (same length): `x[i] · (1/(1 − p))` where element `i` is kept,
/// `x[i] · 0` where it is dropped (so a NaN or infinite input stays NaN, as PyTorch's
/// multiplication by the mask leaves it). The scale is rounded to f32 once; f64 has its own.
pub fn dropout_f32(x: &[f32], out: &mut [f32], seed: u64, salt: u64, p: f64) {
    let (k, pf, s) = (key(seed, salt), p as f32, keep_scale(p) as f32);
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = v * if keeps(k, i as u64, pf) { s } else { 0.0 };
    }
}

/// [`dropout_f32`] in f64 (the same mask; the scale in f64).
pub fn dropout_f64(x: &[f64], out: &mut [f64], seed: u64, salt: u64, p: f64) {
    let (k, pf, s) = (key(seed, salt), p as f32, keep_scale(p));
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = v * if keeps(k, i as u64, pf) { s } else { 0.0 };
    }
}

/// The 64-bit hash of a layer's name that is its dropout salt (FNV-1a), the same on every
/// machine.
pub fn salt_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The seed of step `step` of a run seeded `run_seed` (what the trainer writes to the step's
/// seed input before each step): the same for the same run and step, so a resumed run draws
/// the masks the uninterrupted one drew.
pub fn step_seed(run_seed: u64, step: u64) -> u64 {
    mix(mix(run_seed ^ 0x6472_6f70_6f75_7421).wrapping_add(step.wrapping_mul(GAMMA)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_uniform_on_the_unit_interval_and_repeat() {
        let k = key(7, salt_of("drop1"));
        let n = 200_000u64;
        let mean = (0..n).map(|i| uniform(k, i) as f64).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
        assert!((0..n).all(|i| (0.0..1.0).contains(&uniform(k, i))));
        assert_eq!(uniform(k, 12345), uniform(key(7, salt_of("drop1")), 12345));
        assert_ne!(key(7, salt_of("drop1")), key(7, salt_of("drop2")));
        assert_ne!(key(7, 1), key(8, 1));
        assert_ne!(step_seed(1, 5), step_seed(1, 6));
        assert_ne!(step_seed(1, 5), step_seed(2, 5));
    }

    #[test]
    fn p_zero_keeps_everything_and_p_one_drops_everything() {
        let x = [1.0f32, -2.0, 3.5, 4.0];
        let mut out = [9.0f32; 4];
        dropout_f32(&x, &mut out, 3, 4, 0.0);
        assert_eq!(out, x);
        dropout_f32(&x, &mut out, 3, 4, 1.0);
        assert_eq!(out, [0.0, -0.0, 0.0, 0.0]);
    }
}
