//! Channels-last depthwise convolutions on the GPU (issue 48): a step with a 7x7 depthwise
//! convolution (ConvNeXt's) and a 3x3 one of stride 2 (MobileNet's), compiled channels-last
//! for CUDA, runs them as Ingot's direct kernels by default
//! (`ingot_compiler::lower::cuda::conv::DefaultRoute::Depthwise`) and trains to the losses of
//! the NCHW step on the CPU, within f32 and bf16 rounding, and to those of the same step
//! through cuDNN (`INGOT_CONV=cudnn`); two loads give the same bits; the allocation is the plan
//! and nothing is allocated over 50 steps.
//!
//! Without a GPU the GPU tests skip with the reason; with `INGOT_REQUIRE_GPU=1` that is a
//! failure. Run them one at a time (`--test-threads=1`).

use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::ir::{BinaryOp, Conv2d, ConvLayout, DType, Graph, Init};
use ingot_compiler::lower::cuda::conv::DefaultRoute;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::precision::Precision;
use ingot_runtime::cuda::cudnn::{self, ConvPath};
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_testkit::programs::{convs, cuda_program};
use ingot_testkit::steps::assert_losses_track;
use ingot_trainer::session::{Device, Session};

const GPU: Device = Device::Cuda(CudaOptions {
    ordinal: 0,
    serial: false,
});

#[path = "support/gpu_memory.rs"]
mod gpu_memory;

/// `x [8, 3, 20, 20] -> conv 3→40 (3x3, padding 1) -> depthwise 7x7 (padding 3) -> relu ->
/// depthwise 3x3 (stride 2, padding 1)`, loss the sum of squares, SGD at lr `LR` (at 0.01 the
/// loss grew from 9.1e3 to 1.5e11 in one step and to inf in the next, on the CPU as on the GPU).
fn model() -> Model {
    let mut g = Graph::new();
    let x = g.input("x", [8, 3, 20, 20], DType::F32).unwrap();
    let init = Init::Normal { std: 0.2 };
    let w0 = g.parameter("w0", [40, 3, 3, 3], DType::F32, init).unwrap();
    let w1 = g.parameter("w1", [40, 1, 7, 7], DType::F32, init).unwrap();
    let w2 = g.parameter("w2", [40, 1, 3, 3], DType::F32, init).unwrap();
    let conv = |s: usize, p: usize, groups: usize| Conv2d {
        stride: [s; 2],
        padding: [p; 2],
        dilation: [1, 1],
        groups,
        layout: Default::default(),
    };
    let h = g.conv2d(x, w0, conv(1, 1, 1)).unwrap();
    let h = g.conv2d(h, w1, conv(1, 3, 40)).unwrap();
    let h = ingot_compiler::trace::nn::relu(&mut g, h).unwrap();
    let o = g.conv2d(h, w2, conv(2, 1, 40)).unwrap();
    let sq = g.binary(BinaryOp::Mul, o, o).unwrap();
    let l = g.sum_all(sq).unwrap();
    g.set_output(ingot_compiler::autodiff::LOSS, l).unwrap();
    Model::new("depthwise", g, Optimizer::Sgd { lr: LR })
}

/// The learning rate at which three steps of [`model`] fall and stay finite.
const LR: f64 = 1e-5;

/// The step for `device` in `precision`, channels-last where `channels_last`.
fn session(precision: Precision, device: Device, channels_last: bool) -> Session {
    let opts = Options {
        precision: Some(precision),
        channels_last: channels_last.into(),
        ..Options::for_target(device.target())
    };
    let exe = pipeline::compile(&model(), &opts)
        .unwrap()
        .executable(device.target())
        .unwrap();
    Session::from_executable(exe, 5, device).unwrap()
}

/// Runs anywhere: the channels-last CUDA step's depthwise passes (two convolutions, three
/// passes each) have their direct kernels as fallback and the default route to them.
#[test]
fn a_channels_last_steps_depthwise_passes_default_to_their_direct_kernels() {
    for precision in [Precision::F32, Precision::Bf16] {
        let opts = Options {
            precision: Some(precision),
            channels_last: true.into(),
            ..Options::for_target(ingot_compiler::lower::Target::Cuda)
        };
        let c = pipeline::compile(&model(), &opts).unwrap();
        let exe = c.executable(ingot_compiler::lower::Target::Cuda).unwrap();
        let depthwise: Vec<_> = convs(cuda_program(&exe))
            .into_iter()
            .filter(|c| c.dims.groups > 1)
            .collect();
        assert_eq!(depthwise.len(), 6, "{precision:?}");
        for c in depthwise {
            assert_eq!(c.layout, ConvLayout::Nhwc);
            assert_eq!(c.default_route(), DefaultRoute::Depthwise, "{:?}", c.pass);
            assert!(!c.fallback.is_empty());
        }
    }
}

/// Runs anywhere: the CPU's f32 step of [`model`] falls for three steps at [`LR`], so the GPU
/// tests compare finite losses that move.
#[test]
fn the_test_models_loss_falls_and_stays_finite_on_the_cpu() {
    let mut cpu = session(Precision::F32, Device::Cpu, false);
    let losses: Vec<f64> = (0..3).map(|_| cpu.step().unwrap().loss).collect();
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
}

fn gpu_matches_cpu(precision: Precision, steps: u64, tolerance: f64) {
    cudnn::set_conv_path(cudnn::ConvSetting::Auto);
    let mut cpu = session(precision, Device::Cpu, false);
    let mut gpu = session(precision, GPU, true);
    let choices = gpu.cuda().unwrap().conv_choices().to_vec();
    let direct = (choices.iter())
        .filter(|c| matches!(&c.path, ConvPath::Direct { reason } if reason.contains("depthwise")))
        .count();
    assert_eq!(direct, 6, "{choices:?}");
    let what = format!("{precision:?}, depthwise direct on the GPU against the CPU's NCHW");
    assert_losses_track(&what, &mut gpu, &mut cpu, steps, tolerance);
    // The same step with every convolution through cuDNN trains alike.
    cudnn::set_conv_path(cudnn::ConvSetting::Cudnn);
    let mut through = session(precision, GPU, true);
    cudnn::set_conv_path(cudnn::ConvSetting::Auto);
    let mut gpu = session(precision, GPU, true);
    let what = format!("{precision:?}, direct against cuDNN (the second)");
    assert_losses_track(&what, &mut gpu, &mut through, steps, tolerance);
}

#[test]
fn a_depthwise_step_trains_on_cuda_as_the_nchw_step_on_the_cpu_in_f32() {
    if cuda::gpu_for_test("depthwise direct vs cpu, f32") {
        gpu_matches_cpu(Precision::F32, 3, 1e-4);
    }
}

#[test]
fn a_depthwise_step_trains_on_cuda_as_on_the_cpu_within_bf16_rounding() {
    if cuda::gpu_for_test("depthwise direct vs cpu, bf16") {
        gpu_matches_cpu(Precision::Bf16, 3, 1e-2);
    }
}

#[test]
fn a_depthwise_step_gives_the_same_bits_on_two_loads_and_allocates_nothing() {
    if !cuda::gpu_for_test("depthwise direct run twice") {
        return;
    }
    cudnn::set_conv_path(cudnn::ConvSetting::Auto);
    let run = || {
        let mut s = session(Precision::Bf16, GPU, true);
        (0..3)
            .map(|_| s.step().unwrap().loss.to_bits())
            .collect::<Vec<u64>>()
    };
    assert_eq!(run(), run(), "the losses differ between two loads");
    let mut s = session(Precision::Bf16, GPU, true);
    gpu_memory::takes_its_plan_and_allocates_nothing(&mut s, 50);
}
