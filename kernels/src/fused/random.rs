//! A small seeded generator (SplitMix64) for building random fused kernels and their inputs
//! reproducibly: the property tests, the CUDA generator's tests and the GPU check program
//! (`runtime/examples/cuda_kernels.rs`) all draw from it, so a failing seed means the same
//! kernel everywhere.

/// SplitMix64: the state advances by a fixed odd constant and is mixed on the way out.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// One of `xs`, uniformly (`xs` must not be empty).
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_same_seed_gives_the_same_sequence_and_splitmix64s_reference_values() {
        let mut a = Rng(0);
        let mut b = Rng(0);
        let xs: Vec<u64> = (0..3).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..3).map(|_| b.next_u64()).collect::<Vec<_>>());
        // SplitMix64 from state 0 (Vigna's reference implementation).
        assert_eq!(xs[0], 0xE220_A839_7B1D_CDAF);
        assert_eq!(Rng(5).below(0), 0);
    }
}
