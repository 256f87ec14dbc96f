//! Every convolution through cuDNN on the GPU, NCHW ones too (`INGOT_CONV=cudnn`; these tests
//! ask for it with `cudnn::set_conv_path`): a small CNN of every kind of convolution (7x7 with
//! stride 2 and padding, dilation, groups, depthwise with stride 2, 1x1) trained on CUDA
//! against the same session on the CPU: f32 (strict, cuDNN's FMA math) losses and parameters
//! within 1e-4, tf32 (against the CPU's f32: the CPU has no tf32) and bf16 losses within their
//! rounding; every convolution pass of the step
//! runs through cuDNN (not the im2col fallback) when cuDNN loads, by the heuristics' first
//! deterministic algorithm, not timed; two GPU runs choose the same algorithms and give the
//! same bits; the allocation is the plan, and nothing is
//! allocated over 200 steps.
//!
//! Without a GPU these skip with the reason; with `INGOT_REQUIRE_GPU=1` (scripts/gpu_check.sh
//! sets it) that is a failure, and so is a GPU without cuDNN (set `INGOT_CUDNN_DIR` or
//! `LD_LIBRARY_PATH` to the directory of `libcudnn.so.9`, e.g. PyTorch's
//! `site-packages/nvidia/cudnn/lib`). Run them one at a time (`--test-threads=1`).

use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::ir::{DType, Graph};
use ingot_compiler::lower::cuda::DeviceOp;
use ingot_compiler::lower::Program;
use ingot_compiler::model::Model;
use ingot_compiler::model::ID_DTYPE;
use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::precision::Precision;
use ingot_compiler::trace::nn;
use ingot_runtime::cuda::cudnn::{self, ConvPath};
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_testkit::programs::cuda_program;
use ingot_testkit::steps::assert_gpu_tracks_cpu;
use ingot_trainer::session::{Device, Session};

const GPU: Device = Device::Cuda(CudaOptions {
    ordinal: 0,
    serial: false,
});

#[path = "support/gpu_memory.rs"]
mod gpu_memory;

/// `x [4, 3, 24, 24]`: a 7x7 stem with stride 2 and padding 3 (12x12), a dilated 3x3
/// (dilation 2, padding 2), a grouped 3x3 (4 groups), a depthwise 3x3 with stride 2 (6x6), a
/// 1x1, each with a ReLU; global average pooling, a linear layer to 10 classes, cross-entropy.
fn model() -> Model {
    let mut g = Graph::new();
    let x = g.input("x", [4, 3, 24, 24], DType::F32).unwrap();
    let y = g.input("y", [4], ID_DTYPE).unwrap();
    // (name, in, out, kernel, stride, padding, dilation, groups)
    let layers = [
        ("stem", 3, 16, 7, 2, 3, 1, 1),
        ("dilated", 16, 16, 3, 1, 2, 2, 1),
        ("grouped", 16, 32, 3, 1, 1, 1, 4),
        ("depthwise", 32, 32, 3, 2, 1, 1, 32),
        ("pointwise", 32, 24, 1, 1, 0, 1, 1),
    ];
    let mut h = x;
    for (name, cin, cout, k, s, p, d, groups) in layers {
        h = nn::conv2d(&mut g, name, h, cin, cout, k, s, p, d, groups, true).unwrap();
        h = nn::relu(&mut g, h).unwrap();
    }
    let h = nn::global_avg_pool(&mut g, h).unwrap();
    let h = nn::flatten(&mut g, h).unwrap();
    let logits = nn::linear_kaiming(&mut g, "fc", h, 24, 10, true).unwrap();
    let loss = nn::softmax_cross_entropy(&mut g, logits, y).unwrap();
    g.set_output("loss", loss).unwrap();
    Model::new("convs", g, Optimizer::momentum(0.01, 0.9, 0.0))
}

fn session(precision: Precision, device: Device) -> Session {
    cudnn::set_conv_path(cudnn::ConvSetting::Cudnn);
    let opts = Options {
        precision: Some(precision),
        ..Options::for_target(device.target())
    };
    let exe = pipeline::compile(&model(), &opts)
        .unwrap()
        .executable(device.target())
        .unwrap();
    if let Program::Cuda(p) = exe.program() {
        let convs = p
            .ops
            .iter()
            .filter(|op| matches!(op, DeviceOp::Conv(_)))
            .count();
        // Five forwards, five filter gradients, four data gradients (the stem's input is data).
        assert_eq!(convs, 14, "the step's convolution passes");
    }
    Session::from_executable(exe, 5, device).unwrap()
}

/// Whether cuDNN must be there: on the GPU machine (`INGOT_REQUIRE_GPU`) it must.
fn expect_cudnn() -> bool {
    match cudnn::load() {
        Ok(lib) => {
            eprintln!("cuDNN {} from {}", lib.version, lib.path);
            true
        }
        Err(e) if cuda::require::gpu_required() => {
            panic!("INGOT_REQUIRE_GPU is set but cuDNN does not load: {e}")
        }
        Err(e) => {
            eprintln!("cuDNN does not load ({e}): checking the im2col fallback instead");
            false
        }
    }
}

/// Every convolution of `s`'s step runs through cuDNN: the first deterministic algorithm of
/// cuDNN's heuristic order that fits its planned workspace (printing each choice).
fn all_through_cudnn(s: &Session) {
    let choices = s.cuda().expect("a GPU session").conv_choices();
    assert_eq!(choices.len(), 14);
    for c in choices {
        eprintln!("{c}");
        assert!(matches!(c.path, ConvPath::Cudnn { .. }), "{c}");
        assert!(c.timings.is_empty(), "timed without INGOT_CONV_TIMING: {c}");
    }
}

fn gpu_matches_cpu(precision: Precision, steps: u64, tolerance: f64) {
    let cudnn = expect_cudnn();
    // The CPU has no tf32: a tf32 step is checked against its f32 step.
    let on_cpu = match precision {
        Precision::Tf32 => Precision::F32,
        p => p,
    };
    let mut cpu = session(on_cpu, Device::Cpu);
    let mut gpu = session(precision, GPU);
    if cudnn {
        all_through_cudnn(&gpu);
    }
    let what = format!("{precision:?}, gpu against cpu");
    assert_gpu_tracks_cpu(&what, (&mut gpu, &mut cpu), precision, steps, tolerance);
}

/// Runs anywhere: the step's 14 convolution passes each lower to one cuDNN operation.
#[test]
fn every_convolution_pass_of_the_cnn_lowers_to_a_cudnn_operation() {
    let exe = pipeline::compile(&model(), &Options::for_target(GPU.target()))
        .unwrap()
        .executable(GPU.target())
        .unwrap();
    let p = cuda_program(&exe);
    assert_eq!(p.counts().convs, 14);
}

#[test]
fn through_cudnn_a_cnn_of_every_kind_of_convolution_trains_as_on_the_cpu_in_f32() {
    if cuda::gpu_for_test("cuDNN convolutions vs cpu, f32") {
        gpu_matches_cpu(Precision::F32, 5, 1e-4);
    }
}

#[test]
fn through_cudnn_the_cnn_trains_as_on_the_cpu_within_tf32_and_bf16_rounding() {
    if cuda::gpu_for_test("cuDNN convolutions vs cpu, tf32 and bf16") {
        gpu_matches_cpu(Precision::Tf32, 3, 1e-2);
        gpu_matches_cpu(Precision::Bf16, 3, 1e-2);
    }
}

#[test]
fn two_runs_through_cudnn_give_the_same_bits() {
    if !cuda::gpu_for_test("cuDNN convolutions run twice") {
        return;
    }
    for precision in [Precision::F32, Precision::Bf16] {
        let run = || {
            let mut s = session(precision, GPU);
            let choices: Vec<String> = (s.cuda().unwrap().conv_choices().iter())
                .map(|c| c.to_string())
                .collect();
            let losses: Vec<u64> = (0..3).map(|_| s.step().unwrap().loss.to_bits()).collect();
            let params: Vec<Vec<u8>> = s.parameters().values().map(|t| t.to_le_bytes()).collect();
            (losses, params, choices)
        };
        let (a, b) = (run(), run());
        assert_eq!(a.2, b.2, "{precision:?}: the two loads chose differently");
        assert_eq!(
            a.0, b.0,
            "{precision:?}: the losses differ between two runs"
        );
        assert!(
            a.1 == b.1,
            "{precision:?}: the parameters differ between two runs"
        );
    }
}

#[test]
fn a_cudnn_step_takes_exactly_its_plan_and_allocates_nothing() {
    if !cuda::gpu_for_test("cuDNN convolutions zero allocation") {
        return;
    }
    let mut s = session(Precision::Bf16, GPU);
    gpu_memory::takes_its_plan_and_allocates_nothing(&mut s, 200);
}
