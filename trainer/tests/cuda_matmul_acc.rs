//! `matmul_acc` (`c + a·b`, cuBLAS with beta = 1) on the GPU: a small GPT with its loss head in
//! row chunks and one accumulated over two micro-batches, in f32 and bf16, trained on CUDA
//! against the same step on the CPU (whose `matmul_acc` is checked against a naive reference in
//! runtime/tests/matmul_acc.rs). The bf16 steps sum the head's bf16 products into an f32
//! gradient with `Compute::Bf16InF32Out` (A/B `CUDA_R_16BF`, C `CUDA_R_32F`).
//!
//! Without a GPU these skip with the reason; with `INGOT_REQUIRE_GPU=1` (scripts/gpu_check.sh
//! sets it) that is a failure. Run them one at a time (`--test-threads=1`).

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::ir::{DType, Op};
use ingot_compiler::lower::cuda::{Compute, DeviceOp};
use ingot_compiler::lower::{Program, Target};
use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::precision::Precision;
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_testkit::programs::{cuda_program, gemms};
use ingot_testkit::steps::assert_losses_track;
use ingot_trainer::session::{Device, Session};

const GPU: Device = Device::Cuda(CudaOptions {
    ordinal: 0,
    serial: false,
});

/// A small GPT whose `[128, 512]` logits (256 KiB in f32) are split by a 64 KiB chunk limit.
const SPEC: &str = "gpt:vocab=512,d_model=64,layers=2,heads=4,d_ff=256,seq=32,batch=4";

fn session(precision: Precision, step: &StepOptions, device: Device) -> Session {
    let m = if step.accumulate > 1 {
        ingot_models::at_batch(SPEC, 4 / step.accumulate, DType::F32).unwrap()
    } else {
        ingot_models::by_name(SPEC).unwrap()
    };
    let opts = Options {
        precision: Some(precision),
        ..Options::for_target(device.target())
    };
    let c = pipeline::compile_observed_with(&m, step, &opts, &mut |_| {}).unwrap();
    assert!(
        c.graph
            .nodes()
            .iter()
            .any(|n| matches!(n.op, Op::MatMulAcc { .. })),
        "{precision:?}: no matmul_acc in the step"
    );
    let exe = c.executable(device.target()).unwrap();
    if let Program::Cuda(p) = exe.program() {
        let acc = p
            .ops
            .iter()
            .filter(|op| matches!(op, DeviceOp::Gemm(g) if g.accumulate))
            .count();
        assert!(acc > 0, "no GEMM with beta = 1");
        if precision == Precision::Bf16 {
            assert!(p
                .ops
                .iter()
                .any(|op| matches!(op, DeviceOp::Gemm(g) if g.compute == Compute::Bf16InF32Out)));
        }
    }
    Session::from_executable(exe, 7, device).unwrap()
}

fn gpu_matches_cpu(precision: Precision, step: &StepOptions, what: &str) {
    let tol = if precision == Precision::Bf16 {
        1e-2
    } else {
        1e-5
    };
    let mut cpu = session(precision, step, Device::Cpu);
    let mut gpu = session(precision, step, GPU);
    let what = format!("{what} {precision:?}, gpu against cpu");
    assert_losses_track(&what, &mut gpu, &mut cpu, 10, tol);
}

fn chunked() -> StepOptions {
    StepOptions {
        loss_head_chunk_bytes: 64 << 10,
        ..Default::default()
    }
}

#[test]
fn on_the_gpu_a_chunked_loss_head_accumulated_by_cublas_matches_the_cpu() {
    if cuda::gpu_for_test("matmul_acc: chunked loss head vs cpu") {
        for p in [Precision::F32, Precision::Bf16] {
            gpu_matches_cpu(p, &chunked(), "chunked head");
        }
    }
}

#[test]
fn on_the_gpu_two_micro_batches_accumulated_by_cublas_match_the_cpu() {
    let step = StepOptions {
        accumulate: 2,
        ..Default::default()
    };
    if cuda::gpu_for_test("matmul_acc: accumulate 2 vs cpu") {
        for p in [Precision::F32, Precision::Bf16] {
            gpu_matches_cpu(p, &step, "accumulate 2");
        }
    }
}

/// Without a GPU: the CUDA lowering of the bf16 chunked step (what the GPU tests run) has
/// the head's sums as GEMMs with beta = 1, bf16 operands and an f32 result.
#[test]
fn the_bf16_chunked_step_lowers_its_head_sums_to_bf16_into_f32_gemms_with_beta_one() {
    let m = ingot_models::by_name(SPEC).unwrap();
    let opts = Options {
        precision: Some(Precision::Bf16),
        ..Options::for_target(Target::Cuda)
    };
    let c = pipeline::compile_observed_with(&m, &chunked(), &opts, &mut |_| {}).unwrap();
    let exe = c.executable(Target::Cuda).unwrap();
    let head: Vec<_> = gemms(cuda_program(&exe))
        .into_iter()
        .filter(|g| g.compute == Compute::Bf16InF32Out)
        .collect();
    assert!(head.len() >= 2, "{} bf16-into-f32 GEMMs", head.len());
    for g in head {
        assert!(g.accumulate);
        assert_eq!((g.dtype, g.operand_dtype()), (DType::F32, DType::BF16));
        assert!(matches!(c.graph.node(g.node).op, Op::MatMulAcc { .. }));
    }
}
