//! A random training step (from the seed in the input's first eight bytes), compiled, fused,
//! planned and run on the CPU, must match the unfused reference interpreter
//! (`ingot_testkit::random_step::check_cpu`; its bounded twin is the property test in
//! ir-tests/tests/random_graphs.rs). Run with `cargo fuzz run fused_step` from this folder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut seed = [0u8; 8];
    let n = data.len().min(8);
    seed[..n].copy_from_slice(&data[..n]);
    if let Err(e) = ingot_testkit::random_step::check_cpu(u64::from_le_bytes(seed)) {
        panic!("{e}");
    }
});
