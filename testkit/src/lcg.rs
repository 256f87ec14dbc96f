//! The one pseudo-random sequence the kernel tests draw their data from: Knuth's MMIX linear
//! congruential generator (multiplier 6364136223846793005, increment 1442695040888963407). Tests
//! need values that are the same on every machine and every run, not good randomness, and no
//! dependency; before this module each test file carried its own copy of the step.

/// The generator's state; every draw advances it one step and reads the new state.
#[derive(Clone, Debug)]
pub struct Lcg(u64);

impl Lcg {
    /// A sequence whose first draw is one step from `state`.
    pub fn new(state: u64) -> Lcg {
        Lcg(state)
    }

    /// A sequence whose first draw is two steps from `seed` (the seed stepped once first, so
    /// that small neighbouring seeds do not start with nearly equal draws).
    pub fn mixed(seed: u64) -> Lcg {
        let mut g = Lcg(seed);
        g.next_u64();
        g
    }

    /// The next state.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }

    /// A value in [0, 1) from the state's top 53 bits (every f64 of that grid equally likely).
    pub fn unit53(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A value in [0, 1) from the state's top 24 bits: exact in f32, so `2u - 1` and any
    /// product by a power of two are exact there too.
    pub fn unit24(&mut self) -> f64 {
        (self.next_u64() >> 40) as f64 / (1u64 << 24) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_knuths_mmix_step_from_the_seed() {
        let mut g = Lcg::new(1);
        let want = 6364136223846793005u64.wrapping_add(1442695040888963407);
        assert_eq!(g.next_u64(), want);
        let mut m = Lcg::mixed(1);
        assert_eq!(
            m.next_u64(),
            want.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407)
        );
    }

    #[test]
    fn unit_draws_lie_in_zero_to_one_and_the_24_bit_ones_are_exact_in_f32() {
        let mut g = Lcg::new(7);
        for _ in 0..10_000 {
            let (a, b) = (g.unit53(), g.unit24());
            assert!((0.0..1.0).contains(&a) && (0.0..1.0).contains(&b));
            assert_eq!(b as f32 as f64, b);
            assert_eq!((b * 2.0 - 1.0) as f32 as f64, b * 2.0 - 1.0);
        }
    }
}
