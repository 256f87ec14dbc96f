//! Convolutional networks on the GPU: `cnn` and `resnet18` (convolutions as im2col / col2im
//! kernels around cuBLAS GEMMs, max pooling, batch norm in fused kernels) against the same
//! sessions on the CPU, in strict f32 (losses and parameters within 1e-4) and in bf16 (losses
//! within bf16 rounding); the allocation exactly the plan, nothing allocated or freed over
//! 1000 steps.
//!
//! Without a GPU these skip with the reason; with `INGOT_REQUIRE_GPU=1` (scripts/gpu_check.sh
//! sets it) that is a failure. Run them one at a time (`--test-threads=1`).

use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::precision::Precision;
use ingot_models::by_name;
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_testkit::steps::assert_gpu_tracks_cpu;
use ingot_trainer::session::{Device, Session};

const STRICT: Device = Device::Cuda(CudaOptions {
    ordinal: 0,
    serial: false,
});

#[path = "support/gpu_memory.rs"]
mod gpu_memory;

fn session(spec: &str, precision: Precision, device: Device) -> Session {
    session_lr(spec, None, precision, device)
}

/// `spec`'s step (at learning rate `lr`, or the model's own) compiled for `device`'s target
/// and loaded there from seed 5.
fn session_lr(spec: &str, lr: Option<f64>, precision: Precision, device: Device) -> Session {
    let mut m = by_name(spec).unwrap();
    if let Some(lr) = lr {
        m.optimizer = m.optimizer.with_lr(lr);
    }
    let opts = Options {
        precision: Some(precision),
        ..Options::for_target(device.target())
    };
    let exe = pipeline::compile(&m, &opts)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
        .executable(device.target())
        .unwrap_or_else(|e| panic!("{spec}: lowering for {:?}: {e}", device.target()));
    Session::from_executable(exe, 5, device).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// Trains `spec` for `steps` steps on both backends from one seed: each step's losses within
/// `tolerance` (relative); in f32 also every parameter after the last step (‖Δ‖/‖p‖).
fn gpu_matches_cpu(spec: &str, precision: Precision, steps: u64, tolerance: f64) {
    gpu_matches_cpu_at(spec, None, precision, steps, tolerance)
}

fn gpu_matches_cpu_at(
    spec: &str,
    lr: Option<f64>,
    precision: Precision,
    steps: u64,
    tolerance: f64,
) {
    let mut cpu = session_lr(spec, lr, precision, Device::Cpu);
    let mut gpu = session_lr(spec, lr, precision, STRICT);
    let what = format!("{spec} {precision:?}, gpu against cpu");
    assert_gpu_tracks_cpu(&what, (&mut gpu, &mut cpu), precision, steps, tolerance);
}

#[test]
fn on_the_gpu_cnn_matches_the_cpu_over_ten_steps() {
    if cuda::gpu_for_test("cnn vs cpu") {
        gpu_matches_cpu("cnn", Precision::F32, 10, 1e-4);
    }
}

/// resnet18 memorises a fixed batch within a few steps, and the two backends' rounding
/// differences (summation orders, and through them ReLU inputs within rounding of 0 that fall
/// on either side) grow with it. Measured on the H100 (2026-11-25): at its own learning rate
/// (0.1) the first two losses agree to the last bit, yet the parameters after them differ by
/// 4.6e-4; at lr 0.01 the fourth loss (0.36, from 2.45) is 9.8e-4 apart; at lr 0.001 the first
/// four are within 1.3e-5 and the fifth (0.98) 1.4e-4 apart. The kernels are compared where
/// the trajectory is not yet chaotic: lr 0.001, four steps. (Against PyTorch, where the same
/// holds, compare_torch.sh anchors resnet18 at each step instead.)
#[test]
fn on_the_gpu_resnet18_matches_the_cpu_over_four_steps() {
    if cuda::gpu_for_test("resnet18 vs cpu") {
        gpu_matches_cpu_at("resnet18", Some(0.001), Precision::F32, 4, 1e-4);
    }
}

/// In bf16 the same holds one decade lower: at lr 0.01 resnet18's loss falls from 2.45 to 0.59
/// in three steps and the two backends' bf16 roundings part by 1.3e-2 at the third (H100,
/// 2026-11-25); at lr 0.001 the kernels are compared, not the fixed batch's memorisation.
#[test]
fn on_the_gpu_bf16_cnn_and_resnet18_match_the_cpu_within_bf16_rounding() {
    if cuda::gpu_for_test("bf16 cnn and resnet18 vs cpu") {
        gpu_matches_cpu("cnn", Precision::Bf16, 5, 1e-2);
        gpu_matches_cpu_at("resnet18", Some(0.001), Precision::Bf16, 3, 1e-2);
    }
}

#[test]
fn a_cnn_gpu_step_takes_exactly_its_plan_and_allocates_nothing() {
    if !cuda::gpu_for_test("cnn zero allocation") {
        return;
    }
    let mut s = session("cnn", Precision::F32, STRICT);
    gpu_memory::takes_its_plan_and_allocates_nothing(&mut s, 1000);
    let mut s = session("resnet18", Precision::Bf16, STRICT);
    gpu_memory::takes_its_plan_and_allocates_nothing(&mut s, 200);
}

/// Batch norm's evaluation mode on the GPU: resnet18's forward-only step (each batch norm by
/// its running statistics, which the training steps before it updated on the device) gives the
/// CPU's evaluation loss, and not the training-mode loss of the same batch.
#[test]
fn on_the_gpu_resnet18_evaluates_by_its_running_statistics_as_the_cpu_does() {
    if !cuda::gpu_for_test("resnet18 eval step vs cpu") {
        return;
    }
    use ingot_compiler::autodiff::StepOptions;
    use ingot_trainer::eval::pair_with_eval;
    let paired = |device: Device| {
        let mut m = by_name("resnet18").unwrap();
        m.optimizer = m.optimizer.with_lr(0.01);
        let opts = Options::for_target(device.target());
        let train =
            pipeline::compile_observed_with(&m, &StepOptions::default(), &opts, &mut |_| {})
                .unwrap()
                .executable(device.target())
                .unwrap();
        Session::from_pair(pair_with_eval(&m, train, &opts).unwrap(), 5, device).unwrap()
    };
    let (mut cpu, mut gpu) = (paired(Device::Cpu), paired(STRICT));
    for _ in 0..3 {
        let (a, b) = (gpu.step().unwrap().loss, cpu.step().unwrap().loss);
        assert!(
            (a - b).abs() <= 1e-4 * b.abs(),
            "training: gpu {a}, cpu {b}"
        );
    }
    let batch = ingot_trainer::init::synthetic_batch(cpu.graph(), 77);
    let (x, y) = (batch["x"].to_le_bytes(), batch["y"].to_le_bytes());
    let (a, b) = (gpu.eval_on(&x, &y).unwrap(), cpu.eval_on(&x, &y).unwrap());
    let rel = (a - b).abs() / b.abs();
    eprintln!("resnet18 eval loss: gpu {a:.8} cpu {b:.8} rel {rel:.2e}");
    assert!(a.is_finite() && rel <= 1e-4, "eval: gpu {a}, cpu {b}");
    let slots = gpu.input_slots().unwrap();
    let train_mode = gpu.step_on(&slots, &x, &y).unwrap().loss;
    assert!(
        (train_mode - a).abs() > 1e-3 * a.abs(),
        "the eval loss {a} equals the training-mode loss {train_mode}: batch norm ignored its running statistics"
    );
}
