//! bf16 mixed precision on the GPU: every distinct kernel of gpt-mini's bf16 step against the
//! CPU's fused executor (`cuda::kernel_check`, bf16 outputs exact where the GPU's f32
//! arithmetic is the CPU's, within bf16 rounding where it is not), and bf16 sessions on CUDA
//! against the same sessions on the CPU: per-step losses within bf16 rounding over 10 steps,
//! the allocation exactly the plan, and free device memory unchanged over 100 steps.
//!
//! Without a GPU these skip with the reason; with `INGOT_REQUIRE_GPU=1` (scripts/gpu_check.sh
//! sets it) that is a failure. Run them one at a time (`--test-threads=1`).

use ingot_compiler::ir::DType;
use ingot_compiler::lower::cuda::Compute;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::precision::Precision;
use ingot_models::by_name;
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_testkit::kernel_check::{assert_kernels_pass, Source};
use ingot_testkit::programs::{cuda_program, gemms};
use ingot_testkit::steps::assert_losses_track;
use ingot_trainer::session::{Device, Session};

const STRICT: Device = Device::Cuda(CudaOptions {
    ordinal: 0,
    serial: false,
});

/// A small GPT (two layers) beside gpt-mini.
const SMALL_GPT: &str = "gpt:vocab=256,d_model=64,layers=2,heads=4,d_ff=256,seq=32,batch=4";

/// `spec`'s bf16 step compiled for `device`'s target and loaded there from `seed`.
fn bf16_session(spec: &str, seed: u64, device: Device) -> Session {
    let m = by_name(spec).unwrap();
    let opts = Options {
        precision: Some(Precision::Bf16),
        ..Options::for_target(device.target())
    };
    let exe = pipeline::compile(&m, &opts)
        .unwrap_or_else(|e| panic!("{spec}: bf16 step: {e}"))
        .executable(device.target())
        .unwrap_or_else(|e| panic!("{spec}: bf16 lowering for {:?}: {e}", device.target()));
    Session::from_executable(exe, seed, device).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

#[path = "../../trainer/tests/support/gpu_memory.rs"]
mod gpu_memory;

#[test]
fn every_bf16_gpt_mini_kernel_matches_the_cpu_on_the_gpu() {
    if cuda::gpu_for_test("bf16 gpt-mini kernels") {
        assert_kernels_pass(&Source::bf16_models(&["gpt-mini"]));
    }
}

#[test]
fn every_bf16_gpt2_kernel_matches_the_cpu_on_the_gpu() {
    if cuda::gpu_for_test("bf16 gpt2 kernels") {
        assert_kernels_pass(&Source::bf16_models(&["gpt2"]));
    }
}

/// Trains `spec`'s bf16 step for ten steps on the CPU and on the GPU from the same seed: the
/// losses agree within bf16 rounding (1e-2 relative: the two backends round the same values,
/// but the GPU's exp, tanh and sums differ in f32's last bits, which moves a bf16 rounding by
/// an ulp here and there).
fn bf16_gpu_matches_cpu(spec: &str, steps: u64) {
    let mut cpu = bf16_session(spec, 5, Device::Cpu);
    let mut gpu = bf16_session(spec, 5, STRICT);
    let what = format!("{spec} bf16, gpu against cpu");
    assert_losses_track(&what, &mut gpu, &mut cpu, steps, 1e-2);
}

#[test]
fn on_the_gpu_bf16_gpt_mini_matches_the_cpu_over_five_steps() {
    // Five, not ten: gpt-mini's bf16 step takes about 20 s on the GPU machine's CPU (each
    // reduction and matmul through widened copies), and five steps showed the agreement
    // (rel <= 6e-5) on the H100.
    if cuda::gpu_for_test("bf16 gpt-mini vs cpu") {
        bf16_gpu_matches_cpu("gpt-mini", 5);
    }
}

#[test]
fn on_the_gpu_a_bf16_small_gpt_matches_the_cpu_over_ten_steps() {
    if cuda::gpu_for_test("bf16 small gpt vs cpu") {
        bf16_gpu_matches_cpu(SMALL_GPT, 10);
    }
}

/// gpt2's bf16 step runs on the GPU (too large for a CPU comparison here): five steps from the
/// seed of an f32 run on the same GPU give losses within 2% of the f32 ones.
#[test]
fn on_the_gpu_bf16_gpt2_trains_within_two_percent_of_f32() {
    if !cuda::gpu_for_test("bf16 gpt2") {
        return;
    }
    let mut bf16 = bf16_session("gpt2", 5, STRICT);
    let mut f32 = Session::on(&by_name("gpt2").unwrap(), 5, STRICT).unwrap();
    assert_losses_track("gpt2, bf16 against f32", &mut bf16, &mut f32, 5, 2e-2);
}

#[test]
fn a_bf16_gpu_step_takes_exactly_its_plan_and_frees_nothing_over_100_steps() {
    if !cuda::gpu_for_test("bf16 zero allocation") {
        return;
    }
    let mut s = bf16_session("gpt-mini", 1, STRICT);
    gpu_memory::takes_its_plan_and_allocates_nothing(&mut s, 100);
}

/// Runs without a GPU too: the CPU reference the GPU sessions are held to trains.
#[test]
fn the_bf16_cpu_reference_session_trains_to_finite_losses() {
    let mut s = bf16_session(SMALL_GPT, 5, Device::Cpu);
    for _ in 0..2 {
        let loss = s.step().unwrap().loss;
        assert!(loss.is_finite() && loss > 0.0, "loss {loss}");
    }
}

/// Runs without a GPU too: the bf16 gpt-mini step lowers for CUDA (every kernel generated, no
/// refusal), with its matrix products bf16 with f32 accumulation.
#[test]
fn the_bf16_gpt_mini_step_lowers_for_cuda_with_bf16_gemms() {
    let m = by_name("gpt-mini").unwrap();
    let opts = Options {
        precision: Some(Precision::Bf16),
        ..Options::for_target(Target::Cuda)
    };
    let c = pipeline::compile(&m, &opts).unwrap();
    let exe = c.executable(Target::Cuda).unwrap();
    let p = cuda_program(&exe);
    let gemms = gemms(p);
    assert!(!gemms.is_empty(), "no GEMM in the bf16 step");
    for g in &gemms {
        // A product summed into an f32 value (`matmul_acc`): bf16 operands, an f32 result.
        let want = if g.accumulate && g.dtype == DType::F32 {
            (DType::F32, Compute::Bf16InF32Out)
        } else {
            (DType::BF16, Compute::Bf16F32)
        };
        assert_eq!(
            (g.dtype, g.compute),
            want,
            "a GEMM of the bf16 step, node {:?}",
            g.node
        );
    }
    let bf16_kernels = p
        .kernels
        .iter()
        .filter(|k| k.source.contains("unsigned short*"))
        .count();
    assert!(bf16_kernels >= 10, "{bf16_kernels} kernels move bf16");
}
