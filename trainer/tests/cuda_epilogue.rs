//! Bias adds taken into their GEMMs as cuBLASLt's bias epilogue
//! ([`ingot_compiler::lower::cuda::epilogue`]) on the GPU: a small GPT whose attention runs as
//! the library kernel, so that each layer's qkv bias add is a kernel of its own (as gpt2's),
//! trained on CUDA in f32, tf32 and bf16 against the same step on the CPU, which adds the bias
//! in its own kernel (under bf16 the epilogue rounds the product once, the CPU's kernel twice:
//! within the bf16 tolerance).
//!
//! The cuBLASLt path runs with `INGOT_GEMM_EPILOGUE=1` (else each epilogue's fallback: the
//! GEMM, then the bias kernel). Without a GPU these skip with the reason; with `INGOT_REQUIRE_GPU=1` (scripts/gpu_check.sh
//! sets it) that is a failure. Run them one at a time (`--test-threads=1`).

use ingot_compiler::lower::cuda::DeviceOp;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::precision::Precision;
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_testkit::programs::cuda_program;
use ingot_testkit::steps::assert_losses_track;
use ingot_trainer::session::{Device, Session};

const GPU: Device = Device::Cuda(CudaOptions {
    ordinal: 0,
    serial: false,
});

/// Two layers, head size 32 and 64 positions: the attention is the library's.
const SPEC: &str = "gpt:vocab=256,d_model=64,layers=2,heads=2,d_ff=256,seq=64,batch=4";

fn compiled(precision: Precision, target: Target) -> pipeline::Compiled {
    let m = ingot_models::by_name(SPEC).unwrap();
    let opts = Options {
        precision: Some(precision),
        ..Options::for_target(target)
    };
    pipeline::compile(&m, &opts).unwrap()
}

fn session(precision: Precision, device: Device) -> Session {
    let exe = compiled(precision, device.target())
        .executable(device.target())
        .unwrap();
    Session::from_executable(exe, 7, device).unwrap()
}

/// Without a GPU: each layer's qkv bias rides on its GEMM in every precision; under bf16
/// (an f32 bias, which cuBLASLt refuses on a bf16 result) rounded to bf16 first, into the
/// GEMM's workspace.
#[test]
fn each_layers_qkv_bias_add_is_its_gemms_epilogue_in_every_precision() {
    for p in [Precision::F32, Precision::Tf32, Precision::Bf16] {
        let exe = compiled(p, Target::Cuda).executable(Target::Cuda).unwrap();
        let with: Vec<_> = cuda_program(&exe)
            .ops
            .iter()
            .filter_map(|op| match op {
                DeviceOp::Gemm(g) => g.epilogue.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(with.len(), 2, "{p:?}: GEMMs with a bias epilogue");
        let rounded = with.iter().filter(|e| e.round.is_some()).count();
        let want = if p == Precision::Bf16 { 2 } else { 0 };
        assert_eq!(rounded, want, "{p:?}: biases rounded before the call");
    }
}

#[test]
fn on_the_gpu_gemms_with_bias_epilogues_track_the_cpu() {
    if cuda::gpu_for_test("gemm epilogues vs cpu") {
        for (p, tol) in [
            (Precision::F32, 1e-5),
            (Precision::Tf32, 1e-2),
            (Precision::Bf16, 1e-2),
        ] {
            // The CPU has no tf32: a tf32 step is checked against its f32 step.
            let on_cpu = match p {
                Precision::Tf32 => Precision::F32,
                p => p,
            };
            let mut cpu = session(on_cpu, Device::Cpu);
            let mut gpu = session(p, GPU);
            let what = format!("bias epilogues {p:?}, gpu against cpu");
            assert_losses_track(&what, &mut gpu, &mut cpu, 10, tol);
        }
    }
}
