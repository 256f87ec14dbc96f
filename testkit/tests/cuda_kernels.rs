//! Every CUDA kernel against the CPU, on the GPU: each distinct kernel of the mlp, gpt-mini and
//! gpt2 training steps (fused kernels, gather, scatter-add, concat), dropout's kernels, and random fused kernels
//! whose integer results must agree bit for bit; outputs an unwritten element would show in,
//! and in-place runs where a kernel may write over its input (`cuda::kernel_check`).
//!
//! Without a GPU these skip with the reason; with `INGOT_REQUIRE_GPU=1` (scripts/gpu_check.sh
//! sets it) that is a failure. Run them one at a time (`--test-threads=1`): gpt2's kernels take
//! several GiB of device memory each.

use ingot_runtime::cuda::gpu_for_test;
use ingot_testkit::kernel_check::{assert_kernels_pass, Source};

#[test]
fn every_mlp_kernel_matches_the_cpu_on_the_gpu() {
    if gpu_for_test("mlp kernels") {
        assert_kernels_pass(&Source::models(&["mlp"]));
    }
}

#[test]
fn every_gpt_mini_kernel_matches_the_cpu_on_the_gpu() {
    if gpu_for_test("gpt-mini kernels") {
        assert_kernels_pass(&Source::models(&["gpt-mini"]));
    }
}

#[test]
fn every_gpt2_kernel_matches_the_cpu_on_the_gpu() {
    if gpu_for_test("gpt2 kernels") {
        assert_kernels_pass(&Source::models(&["gpt2"]));
    }
}

#[test]
fn every_dropout_kernel_draws_the_cpus_mask_on_the_gpu() {
    if gpu_for_test("dropout kernels") {
        assert_kernels_pass(&Source::Dropout);
    }
}

#[test]
fn random_fused_kernels_match_the_cpu_on_the_gpu() {
    if gpu_for_test("random kernels") {
        assert_kernels_pass(&Source::Random(0..300));
    }
}

#[test]
fn scatter_add_sums_every_pattern_of_repeated_and_out_of_range_ids_as_the_cpu_does() {
    if gpu_for_test("scatter-add kernels") {
        assert_kernels_pass(&Source::Scatter);
    }
}
