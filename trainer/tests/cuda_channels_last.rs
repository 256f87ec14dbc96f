//! Channels-last convolutions on the GPU (issue 48), the CUDA default for bf16 steps: a
//! ResNet's step compiled with `channels_last` (every convolution NHWC through cuDNN but the
//! stem's, which keeps NCHW and runs through cuDNN in bf16 where its planned workspace holds
//! the room cuDNN's fast algorithm asks, else as im2col + cuBLAS; the transposes placed by
//! `ingot_compiler::layout`) trains on CUDA to the losses of the NCHW step on the CPU, within
//! f32 and bf16 rounding; its allocation is its plan and nothing is allocated over 50 steps.
//! A channels-last step lowers each convolution but the stem's (3 input channels, kept NCHW)
//! with no im2col fallback (checked anywhere).
//!
//! The learning rate is 0.001, as in cuda_conv.rs: at the model's own (0.1) resnet18
//! memorises its fixed batch of four within two steps and the trajectory is chaotic. Measured
//! there on an H200 (2026-11-30, docs/results/gpu-s34-a-channels-last-h200-2026-11-30.txt):
//! f32 losses 1.2e-6 and 7.3e-5 apart at steps 1 and 2, 7.7e-3 at step 3 (the loss jumping
//! from 1.23 to 9.7); bf16 4.2e-3 at step 1, then the trajectories part (1.86 against 3.20).
//!
//! At lr 0.001 the f32 difference still grows about fivefold a step, from rounding: with
//! every convolution channels-last (session 34, call 3) 0, 1.4e-5, 9.5e-6 and 8.6e-5 over
//! four steps; with the stem kept NCHW (session 35, call 2,
//! docs/results/gpu-s35-a-call2-tests-h200-2026-11-30.txt) 9.8e-8, 3.5e-6, 3.0e-5 and 1.6e-4,
//! the stem then running cuDNN or im2col + cuBLAS as the runtime timed faster in that process
//! (each rounds its own way; now the default runs an f32 stem as im2col + cuBLAS, always). So the f32
//! check is three steps within 1e-4; the updates
//! themselves are compared, in f64 on the CPU, by the layout pass's checks
//! (ir-tests/tests/channels_last.rs: equal to 1e-10).
//!
//! Without a GPU the GPU tests skip with the reason; with `INGOT_REQUIRE_GPU=1` that is a
//! failure, and so is a GPU without cuDNN. Run them one at a time (`--test-threads=1`).

use ingot_compiler::ir::ConvLayout;
use ingot_compiler::layout::MIN_CHANNELS_LAST_CHANNELS;
use ingot_compiler::lower::cuda::Conv;
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::precision::Precision;
use ingot_models as models;
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

/// resnet18 at CIFAR's shape (a 3x3 stem, layer4 at 4x4, batch 128), at lr 0.001 as
/// `cuda_conv.rs` compares it: torchvision's shape at side 32 and batch 4 ends in batch norms
/// over four values a channel, where the NHWC reductions' other order of sums parts the GPU's
/// losses from the CPU's by more than f32 rounding within two steps (measured on an H200).
fn resnet() -> Model {
    let mut m = models::by_name("resnet18").unwrap();
    m.optimizer = m.optimizer.with_lr(0.001);
    m
}

/// The step of `m` for `device`, channels-last where `channels_last`.
fn session(m: &Model, precision: Precision, device: Device, channels_last: bool) -> Session {
    let opts = Options {
        precision: Some(precision),
        channels_last: channels_last.into(),
        ..Options::for_target(device.target())
    };
    let exe = pipeline::compile(m, &opts)
        .unwrap()
        .executable(device.target())
        .unwrap();
    Session::from_executable(exe, 5, device).unwrap()
}

/// Runs anywhere: every convolution pass of a channels-last CUDA step but the stem's is one
/// NHWC cuDNN operation with no fallback; the stem, over the image's 3 channels (fewer than
/// `MIN_CHANNELS_LAST_CHANNELS`), keeps NCHW.
#[test]
fn a_channels_last_cuda_step_lowers_every_convolution_but_the_stem_nhwc_without_a_fallback() {
    let opts = Options {
        channels_last: true.into(),
        ..Options::for_target(Target::Cuda)
    };
    let c = pipeline::compile(&resnet(), &opts).unwrap();
    let exe = c.executable(Target::Cuda).unwrap();
    let convs = convs(cuda_program(&exe));
    // resnet18: 20 convolutions, each with three passes but the stem's data gradient.
    assert_eq!(convs.len(), 59);
    let few = |c: &&&Conv| c.dims.in_ch < MIN_CHANNELS_LAST_CHANNELS;
    let stem: Vec<_> = convs.iter().filter(few).collect();
    assert_eq!(stem.len(), 2, "the stem's forward and filter gradient");
    for c in &convs {
        if few(&c) {
            assert_eq!(c.layout, ConvLayout::Nchw, "node {:?}", c.node);
            continue;
        }
        assert_eq!(c.layout, ConvLayout::Nhwc, "node {:?}", c.node);
        assert!(c.fallback.is_empty(), "node {:?} has a fallback", c.node);
    }
}

fn gpu_matches_cpu(precision: Precision, steps: u64, tolerance: f64) {
    cudnn::set_conv_path(cudnn::ConvSetting::Auto);
    if let Err(e) = cudnn::load() {
        panic!("channels-last convolutions need cuDNN, which does not load: {e}");
    }
    // The CUDA default: channels-last where the convolutions are bf16
    // (this test's f32 step is made channels-last by asking, as `INGOT_CONV=cudnn` does).
    let rule = GPU.options().channels_last;
    assert_eq!(rule, ingot_compiler::layout::ChannelsLast::WherePays);
    let by_default = pipeline::compile(
        &resnet(),
        &Options {
            precision: Some(precision),
            ..GPU.options()
        },
    )
    .unwrap();
    let nhwc = by_default.graph.nodes().iter().any(|n| {
        matches!(&n.op, ingot_compiler::ir::Op::Window(w)
            if w.conv().is_some_and(|c| c.layout == ConvLayout::Nhwc))
    });
    assert_eq!(
        nhwc,
        precision == Precision::Bf16,
        "{precision:?} by default"
    );
    let m = resnet();
    let mut cpu = session(&m, precision, Device::Cpu, false);
    let mut gpu = session(&m, precision, GPU, true);
    let c = gpu.cuda().expect("a GPU session");
    // The stem's two passes keep NCHW and run where the executable says: through cuDNN in
    // bf16 where the plan granted the room its fast algorithm asks, else (f32) as im2col +
    // cuBLAS; every channels-last pass runs in cuDNN, by the heuristics' first eligible
    // algorithm (not timed).
    let nchw: Vec<_> = (convs(c.program()).into_iter())
        .filter(|c| c.layout == ConvLayout::Nchw)
        .map(|c| (c.node, c.default_route().cudnn()))
        .collect();
    assert_eq!(nchw.len(), 2, "the stem's forward and filter gradient");
    let choices = c.conv_choices();
    assert_eq!(choices.len(), 59);
    for c in choices {
        match nchw.iter().find(|(node, _)| *node == c.node) {
            Some((_, false)) => assert!(matches!(c.path, ConvPath::Im2col { .. }), "{c}"),
            Some((_, true)) | None => assert!(matches!(c.path, ConvPath::Cudnn { .. }), "{c}"),
        }
        assert!(c.timings.is_empty(), "timed without INGOT_CONV_TIMING: {c}");
    }
    let what = format!("{precision:?}, gpu NHWC against cpu NCHW");
    assert_losses_track(&what, &mut gpu, &mut cpu, steps, tolerance);
}

#[test]
fn a_channels_last_resnet_trains_on_cuda_as_the_nchw_step_on_the_cpu_in_f32() {
    if cuda::gpu_for_test("channels-last resnet vs cpu, f32") {
        gpu_matches_cpu(Precision::F32, 3, 1e-4);
    }
}

#[test]
fn a_channels_last_resnet_trains_on_cuda_as_on_the_cpu_within_bf16_rounding() {
    if cuda::gpu_for_test("channels-last resnet vs cpu, bf16") {
        gpu_matches_cpu(Precision::Bf16, 3, 1e-2);
    }
}

#[test]
fn a_channels_last_step_takes_exactly_its_plan_and_allocates_nothing() {
    if !cuda::gpu_for_test("channels-last zero allocation") {
        return;
    }
    cudnn::set_conv_path(cudnn::ConvSetting::Auto);
    let mut s = session(&resnet(), Precision::Bf16, GPU, true);
    gpu_memory::takes_its_plan_and_allocates_nothing(&mut s, 50);
}

/// The default path is deterministic: two loads of the same channels-last step choose the
/// same algorithm for every convolution and give the same losses to the bit (the choice is
/// cuDNN's heuristic order, not a timing; another process chooses the same, which the GPU
/// scripts check with two `ingot train` runs).
#[test]
fn two_loads_of_a_channels_last_step_choose_alike_and_give_the_same_bits() {
    if !cuda::gpu_for_test("channels-last run twice") {
        return;
    }
    cudnn::set_conv_path(cudnn::ConvSetting::Auto);
    let run = || {
        let mut s = session(&resnet(), Precision::Bf16, GPU, true);
        let choices: Vec<String> = (s.cuda().unwrap().conv_choices().iter())
            .map(|c| c.to_string())
            .collect();
        let losses: Vec<u64> = (0..3).map(|_| s.step().unwrap().loss.to_bits()).collect();
        (choices, losses)
    };
    let (a, b) = (run(), run());
    assert_eq!(a.0, b.0, "the two loads chose differently");
    assert_eq!(a.1, b.1, "the losses differ between two loads");
}
