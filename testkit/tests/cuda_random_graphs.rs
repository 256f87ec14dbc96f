//! Random training steps ([`ingot_compiler::random_graph`]) on the GPU agree with the CPU: one
//! step of each from the same seed, losses, new parameters (SGD) and optimizer state within the
//! tolerance of [`ingot_testkit::random_step`] (the GPU sums in another order).
//!
//! Without a GPU the comparison is skipped with a message saying why, unless
//! `INGOT_REQUIRE_GPU=1` is set, which makes a missing GPU a failure (the GPU check script sets
//! it). The host-side part (each step compiled for the CUDA target, lowered to its device
//! program and every fused kernel's CUDA C generated) runs everywhere.

use ingot_compiler::lower::{Program, Target};
use ingot_compiler::pipeline;
use ingot_compiler::random_graph;
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_testkit::random_step::compare_sessions;
use ingot_trainer::session::Device;

const STRICT: Device = Device::Cuda(CudaOptions {
    ordinal: 0,
    serial: false,
});

/// Seeds compared on the GPU, and lowered on the host.
const SEEDS: u64 = 300;

#[test]
fn random_steps_compile_for_cuda_and_every_kernel_lowers_to_cuda_c() {
    let opts = STRICT.options();
    for seed in 0..SEEDS {
        let m = random_graph::model(seed).unwrap();
        let c = pipeline::compile(&m, &opts).unwrap_or_else(|e| panic!("{}: {e}", m.name));
        let exe = c
            .executable(Target::Cuda)
            .unwrap_or_else(|e| panic!("{}: {e}", m.name));
        let Program::Cuda(p) = exe.program() else {
            panic!("{}: a cuda executable without a cuda program", m.name)
        };
        assert!(!p.ops.is_empty(), "{}: no device operations", m.name);
    }
}

#[test]
fn random_steps_on_the_gpu_match_the_cpu() {
    if !cuda::gpu_for_test("random_steps_on_the_gpu_match_the_cpu") {
        return;
    }
    let mut failures = Vec::new();
    let mut worst = 0f64;
    for seed in 0..SEEDS {
        let m = random_graph::model(seed).unwrap();
        match compare_sessions(&m, seed, STRICT) {
            Ok(w) => worst = worst.max(w),
            Err(e) => failures.push(e),
        }
    }
    eprintln!("{SEEDS} random steps on the GPU, worst difference {worst:.3} of the tolerance");
    assert!(
        failures.is_empty(),
        "{} of {SEEDS} random steps differ on the GPU:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
