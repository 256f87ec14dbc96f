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

/// One test a kernel source: `name => (what the skip names, the source)`. Each checks every
/// kernel of its source on the GPU, or skips with the reason where there is none.
macro_rules! gpu_kernel_tests {
    ($($name:ident => ($what:literal, $source:expr),)*) => {$(
        #[test]
        fn $name() {
            if gpu_for_test($what) {
                assert_kernels_pass(&$source);
            }
        }
    )*};
}

gpu_kernel_tests! {
    every_mlp_kernel_matches_the_cpu_on_the_gpu => ("mlp kernels", Source::models(&["mlp"])),
    every_gpt_mini_kernel_matches_the_cpu_on_the_gpu =>
        ("gpt-mini kernels", Source::models(&["gpt-mini"])),
    every_gpt2_kernel_matches_the_cpu_on_the_gpu => ("gpt2 kernels", Source::models(&["gpt2"])),
    every_dropout_kernel_draws_the_cpus_mask_on_the_gpu => ("dropout kernels", Source::Dropout),
    random_fused_kernels_match_the_cpu_on_the_gpu =>
        ("random kernels", Source::Random(0..300)),
    scatter_add_sums_every_pattern_of_repeated_and_out_of_range_ids_as_the_cpu_does =>
        ("scatter-add kernels", Source::Scatter),
}
