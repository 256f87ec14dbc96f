//! The CUDA backend on a GPU: it matches the CPU backend, allocates nothing per step, and takes
//! exactly its planned memory. Without a GPU (CI, this crate's usual home) the GPU tests print
//! why they skip and pass, and the test that a missing GPU is a clear error runs instead; with
//! `INGOT_REQUIRE_GPU=1` (scripts/gpu_check.sh sets it) a missing GPU fails them
//! (`cuda::gpu_for_test`).
//!
//! On a GPU machine without cargo, build here with `cargo test --release -p ingot
//! --test cuda --no-run`, copy the test binary there and run it (scripts/gpu_check.sh).

use ingot_compiler::exe::Executable;
use ingot_models::by_name;
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_runtime::{Data, Tensor};
use ingot_testkit::programs::cuda_program;
use ingot_testkit::steps::assert_losses_track;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::session::{Device, Session};

const STRICT: Device = Device::Cuda(CudaOptions {
    ordinal: 0,
    serial: false,
});

#[path = "../../trainer/tests/support/gpu_memory.rs"]
mod gpu_memory;

#[test]
fn without_a_gpu_the_cuda_device_is_an_error_that_says_so() {
    if cuda::available().is_ok() {
        eprintln!("skipping: this machine has a GPU");
        return;
    }
    let err = Session::on(&by_name("mlp").unwrap(), 0, STRICT).unwrap_err();
    let text = err.to_string();
    assert_mentions(&text, &["CUDA", "--device cpu"]);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args([
            "train", "--model", "mlp", "--steps", "1", "--device", "cuda",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--device cpu"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn f32s(t: &Tensor) -> Vec<f64> {
    match &t.data {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        other => panic!("not a float tensor: {:?}", other.dtype()),
    }
}

/// ‖a − b‖₂ / ‖b‖₂ over all the given tensors together, and the tensor with the largest
/// max |a − b| / max |b|.
fn relative(a: &Session, b: &Session) -> (f64, String, f64) {
    let (pa, pb) = (a.parameters(), b.parameters());
    let (mut diff, mut norm) = (0.0, 0.0);
    let mut worst = (String::new(), 0.0);
    for (name, tb) in &pb {
        let (x, y) = (f32s(&pa[name]), f32s(tb));
        let mut d_max: f64 = 0.0;
        let mut y_max: f64 = 0.0;
        for (u, v) in x.iter().zip(&y) {
            diff += (u - v) * (u - v);
            norm += v * v;
            d_max = d_max.max((u - v).abs());
            y_max = y_max.max(v.abs());
        }
        let r = d_max / y_max.max(1e-6);
        if r.is_nan() || r > worst.1 {
            worst = (name.clone(), r);
        }
    }
    ((diff / norm).sqrt(), worst.0, worst.1)
}

/// Trains `model` for ten steps on the CPU and on the GPU from the same seed: losses and updated
/// parameters agree within 1e-4 (relative), in strict f32.
fn gpu_matches_cpu(model: &str) {
    let m = by_name(model).unwrap();
    let mut cpu = Session::on(&m, 5, Device::Cpu).unwrap();
    let mut gpu = Session::on(&m, 5, STRICT).unwrap();
    gpu_tracks_cpu(model, &mut gpu, &mut cpu, 10);
}

/// Steps `gpu` and `cpu` together `steps` times: each step's losses, then the parameters, agree
/// within 1e-4 (relative); `what` names the run in the messages.
fn gpu_tracks_cpu(what: &str, gpu: &mut Session, cpu: &mut Session, steps: u64) {
    assert_losses_track(&format!("{what}, gpu against cpu"), gpu, cpu, steps, 1e-4);
    let (rel, worst, worst_rel) = relative(gpu, cpu);
    eprintln!(
        "{what} parameters after {steps} steps: rel {rel:.2e}; worst tensor {worst} {worst_rel:.2e}"
    );
    assert!(
        rel <= 1e-4,
        "{what}: parameters differ by {rel:e} (relative)"
    );
}

/// A causal attention of 1024 positions left as plain math: its four products with the
/// probabilities or their gradient are split at the diagonal (`Gemm::split`), leaving out the
/// zero triangle, and its scores leave out the triangle the softmax masks (whose bytes keep
/// what they held). Three steps on the GPU match the CPU, which multiplies whole matrices.
#[test]
fn causal_attention_products_split_at_the_diagonal_match_the_cpu() {
    use ingot_compiler::lower::cuda::DeviceOp;
    let spec = "gpt:vocab=64,d_model=32,layers=1,heads=2,d_ff=64,seq=1024,batch=2";
    let m = by_name(spec).unwrap();
    let plain = |device: Device| ingot_compiler::pipeline::Options {
        fuse_attention: false,
        ..device.options()
    };
    let exe = ingot_compiler::pipeline::compile(&m, &plain(STRICT))
        .unwrap()
        .executable(STRICT.target())
        .unwrap();
    let p = cuda_program(&exe);
    let split = p
        .ops
        .iter()
        .filter(|op| matches!(op, DeviceOp::Gemm(g) if g.split.is_some()))
        .count();
    assert_eq!(
        split, 6,
        "the layer's products with a zero or unread triangle"
    );
    if !cuda::gpu_for_test("split causal products vs cpu") {
        return;
    }
    let mut gpu = Session::from_executable(exe, 5, STRICT).unwrap();
    let mut cpu = Session::on_with(&m, 5, &plain(Device::Cpu), Device::Cpu).unwrap();
    gpu_tracks_cpu("split products", &mut gpu, &mut cpu, 3);
}

#[test]
fn on_the_gpu_mlp_matches_the_cpu_over_ten_steps() {
    if cuda::gpu_for_test("mlp vs cpu") {
        gpu_matches_cpu("mlp");
    }
}

#[test]
fn on_the_gpu_gpt_mini_matches_the_cpu_over_ten_steps() {
    if cuda::gpu_for_test("gpt-mini vs cpu") {
        gpu_matches_cpu("gpt-mini");
    }
}

/// The head over an odd vocabulary runs on CUDA as a product padded to 64 columns and sliced
/// back (`compiler/src/align.rs`); the CPU multiplies the matrices as they are.
#[test]
fn on_the_gpu_an_odd_vocabulary_gpt_padded_matches_the_cpu_over_ten_steps() {
    if cuda::gpu_for_test("odd vocabulary vs cpu") {
        gpu_matches_cpu("gpt:vocab=301,d_model=64,layers=2,heads=4,d_ff=128,seq=32,batch=4");
    }
}

#[test]
fn a_gpu_step_allocates_nothing_and_takes_exactly_its_plan() {
    if !cuda::gpu_for_test("zero allocation") {
        return;
    }
    let mut s = Session::on(&by_name("gpt-mini").unwrap(), 1, STRICT).unwrap();
    gpu_memory::takes_its_plan_and_allocates_nothing(&mut s, 1000);
}

#[test]
fn tf32_matmuls_stay_close_to_strict_f32() {
    if !cuda::gpu_for_test("tf32") {
        return;
    }
    let m = by_name("mlp").unwrap();
    let mut opts = STRICT.options();
    opts.precision = Some(ingot_compiler::precision::Precision::Tf32);
    let mut a = Session::on_with(&m, 2, &opts, STRICT).unwrap();
    let mut b = Session::on(&m, 2, STRICT).unwrap();
    let (x, y) = (a.step().unwrap().loss, b.step().unwrap().loss);
    // TF32 keeps 10 mantissa bits in products: close, and (on random data) not bit-equal.
    assert!((x - y).abs() / y.abs() < 1e-2, "tf32 {x}, f32 {y}");
}

#[test]
fn a_step_executable_runs_the_kernel_sources_it_carries() {
    if !cuda::gpu_for_test("stored kernels") {
        return;
    }
    let m = by_name("mlp").unwrap();
    let compiled = ingot_compiler::pipeline::compile(&m, &STRICT.options()).unwrap();
    let exe = compiled.executable(STRICT.target()).unwrap();
    let bytes = exe.to_bytes().unwrap();
    let exe = Executable::from_bytes(&bytes, "mlp.ingot").unwrap();
    // Run as stored: the same losses as a session that generates its kernels.
    let mut stored = Session::from_executable(exe.clone(), 5, STRICT).unwrap();
    let mut fresh = Session::on(&m, 5, STRICT).unwrap();
    for step in 1..=3 {
        let (a, b) = (stored.step().unwrap().loss, fresh.step().unwrap().loss);
        assert_eq!(a.to_bits(), b.to_bits(), "step {step}: {a} vs {b}");
    }
    // The stored sources are what NVRTC compiles: a broken one is a compile error, not a
    // silently regenerated kernel.
    use ingot_compiler::exe::{fnv1a64, HEADER_BYTES, MAGIC, VERSION};
    let mut payload: serde_json::Value = serde_json::from_slice(&bytes[HEADER_BYTES..]).unwrap();
    let source = &mut payload["program"]["cuda"]["kernels"][0]["source"];
    *source = format!("{}\nthis is not CUDA C;\n", source.as_str().unwrap()).into();
    let payload = serde_json::to_vec(&payload).unwrap();
    let mut file = MAGIC.to_vec();
    file.extend_from_slice(&VERSION.to_le_bytes());
    file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    file.extend_from_slice(&fnv1a64(&payload).to_le_bytes());
    file.extend_from_slice(&payload);
    // A debug build's reader lowers again and refuses the file ("recompile"); a release
    // build's takes the stored source to NVRTC, which refuses it.
    let broken = Executable::from_bytes(&file, "broken.ingot");
    let Err(e) = broken
        .map_err(|e| e.to_string())
        .and_then(|exe| Session::from_executable(exe, 5, STRICT).map_err(|e| e.to_string()))
    else {
        panic!("a broken stored kernel must not run");
    };
    assert!(e.contains("NVRTC") || e.contains("compil"), "{e}");
}

/// The parameters whose values differ between two sessions, with how many elements differ.
fn differing(a: &Session, b: &Session) -> Vec<(String, usize)> {
    let (pa, pb) = (a.parameters(), b.parameters());
    pb.iter()
        .filter_map(|(name, tb)| {
            let (x, y) = (f32s(&pa[name]), f32s(tb));
            let n = x
                .iter()
                .zip(&y)
                .filter(|(u, v)| u.to_bits() != v.to_bits())
                .count();
            (n > 0).then(|| (name.clone(), n))
        })
        .collect()
}

#[test]
fn the_step_graph_with_overlapping_operations_gives_the_serial_chains_bits() {
    if !cuda::gpu_for_test("overlapping operations") {
        return;
    }
    // The dependency graph lets operations that touch disjoint bytes run side by side; with
    // the memory plan reusing bytes along the schedule, a missing edge would be a race that
    // changes results. Both runs must agree to the bit, step after step.
    let m = by_name("gpt-mini").unwrap();
    let serial = Device::Cuda(CudaOptions {
        serial: true,
        ..CudaOptions::default()
    });
    let mut a = Session::on(&m, 9, STRICT).unwrap();
    let mut b = Session::on(&m, 9, serial).unwrap();
    let mut c = Session::on(&m, 9, serial).unwrap();
    for step in 1..=3 {
        let (x, y, z) = (
            a.step().unwrap().loss,
            b.step().unwrap().loss,
            c.step().unwrap().loss,
        );
        let (graph, control) = (differing(&a, &b), differing(&c, &b));
        assert!(
            graph.is_empty() && control.is_empty() && x.to_bits() == y.to_bits() && z == y,
            "step {step}: losses {x} (graph), {y} and {z} (serial); parameters differing from \
             the serial run: graph {graph:?}, another serial run {control:?}"
        );
    }
}

/// The data path on the GPU (issue 18): batches staged in page-locked buffers and copied
/// asynchronously into the inputs' slots on the step's stream give the same losses as the same
/// batches set through `set_batch`, and free device memory does not move over the steps.
#[test]
fn batches_staged_in_pinned_buffers_train_as_set_batches_do_and_allocate_nothing() {
    if !cuda::gpu_for_test("staged batches on cuda") {
        return;
    }
    use ingot_trainer::data::{BatchSource, Order, TokenBatches, TokenStream};
    let spec = "gpt:vocab=256,d_model=32,layers=1,heads=2,d_ff=64,seq=32,batch=8";
    let model = by_name(spec).unwrap();
    let dir = std::env::temp_dir().join(format!("ingot-cuda-staged-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.bin");
    let tokens: Vec<u8> = (0..20000u32)
        .map(|i| ((i * 7 + i / 13) % 256) as u16)
        .flat_map(|t| t.to_le_bytes())
        .collect();
    std::fs::write(&path, tokens).unwrap();
    let mut staged = Session::on(&model, 1, STRICT).unwrap();
    let mut plain = Session::on(&model, 1, STRICT).unwrap();
    let mut src = TokenBatches::for_graph(
        TokenStream::open(&path).unwrap(),
        staged.graph(),
        Order::Random,
        2,
    )
    .unwrap();
    let slots = staged.input_slots().unwrap();
    let c = staged.cuda().unwrap();
    let (mut x, mut y) = (
        c.pinned_buffer(slots[0].1).unwrap(),
        c.pinned_buffer(slots[1].1).unwrap(),
    );
    let mut free = Vec::new();
    for b in 0..20 {
        src.fill(0, b, x.as_mut(), y.as_mut()).unwrap();
        let a = staged.step_on(&slots, &x, &y).unwrap().loss;
        let xt = src.x().to_tensor(&x).unwrap();
        let yt = src.y().to_tensor(&y).unwrap();
        plain.set_batch(&xt, &yt).unwrap();
        let p = plain.step().unwrap().loss;
        // Same graph, same bytes; only atomics' order may differ between the two sessions.
        assert!(
            (a - p).abs() <= 1e-4 * p.abs(),
            "batch {b}: staged {a}, set {p}"
        );
        free.push(staged.cuda().unwrap().free_memory().unwrap());
    }
    assert!(
        free.windows(2).all(|w| w[0] == w[1]),
        "free memory moved: {free:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A depthwise convolution of 16 channels and a grouped one (2 groups) over 2 images: each
/// pass of each convolution issues at most min(groups, images) GEMMs per chunk of images,
/// batched over the other axis (efficientnet_b0's depthwise layers of up to 1,152 channels
/// were a GEMM per channel, and its step ran for minutes). On a GPU, three steps match the
/// CPU's losses and parameters.
#[test]
fn grouped_convolutions_batch_their_groups_and_match_the_cpu() {
    use ingot_compiler::lower::cuda::{planned_conv_workspace, DeviceOp};
    use std::collections::BTreeMap;
    let text = "ingot-ir 1
%0 = input \"x\" : f32[2,16,9,9]
%1 = parameter \"dw\" init=normal(0.3) : f32[16,1,3,3]
%2 = conv2d(%0, %1) stride=[1,1] padding=[1,1] dilation=[1,1] groups=16 : f32[2,16,9,9]
%3 = tanh(%2) : f32[2,16,9,9]
%4 = parameter \"gw\" init=normal(0.2) : f32[12,8,3,3]
%5 = conv2d(%3, %4) stride=[2,2] padding=[1,1] dilation=[1,1] groups=2 : f32[2,12,5,5]
%6 = mul(%5, %5) : f32[2,12,5,5]
%7 = reduce_sum(%6) axes=[0,1,2,3] : f32[1,1,1,1]
%8 = reshape(%7) : f32[]
output \"loss\" = %8
";
    let m = ingot_compiler::model::Model::from_ir_text("grouped", text).unwrap();
    // The im2col path's lowering (NCHW), which a CUDA step takes without cuDNN.
    let opts = ingot_compiler::pipeline::Options {
        channels_last: ingot_compiler::layout::ChannelsLast::No,
        ..STRICT.options()
    };
    let compiled = ingot_compiler::pipeline::compile(&m, &opts).unwrap();
    let g = &compiled.graph;
    let exe = compiled.executable(STRICT.target()).unwrap();
    let p = cuda_program(&exe);
    let mut gemms: BTreeMap<u32, usize> = BTreeMap::new();
    // The im2col path's GEMMs: each convolution's fallback.
    for op in p.all_ops() {
        if let DeviceOp::Gemm(gemm) = op {
            *gemms.entry(gemm.node.0).or_default() += 1;
        }
    }
    let mut convs = 0;
    for (&node, &count) in &gemms {
        let id = ingot_compiler::ir::NodeId(node);
        let Some(w) = planned_conv_workspace(g, &compiled.plan, id) else {
            continue;
        };
        convs += 1;
        let images = match w.pass {
            ingot_kernels::cpu::conv::Pass::GradWeight => 1,
            _ => w.samples,
        };
        let chunks = w.geometry.batch / w.samples;
        let most = chunks * w.geometry.groups.min(images);
        assert!(
            count <= most,
            "conv node %{node} ({:?}, {} groups, {} images a chunk) issues {count} GEMMs, \
             more than {most}",
            w.pass,
            w.geometry.groups,
            w.samples
        );
    }
    assert!(convs >= 5, "the forward and backward convolutions: {convs}");
    if !cuda::gpu_for_test("grouped convolutions vs cpu") {
        return;
    }
    let mut gpu = Session::from_executable(exe, 5, STRICT).unwrap();
    let mut cpu = Session::on(&m, 5, Device::Cpu).unwrap();
    gpu_tracks_cpu("grouped convolutions", &mut gpu, &mut cpu, 3);
}
