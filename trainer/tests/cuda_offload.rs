//! Offload on the GPU (issue 51): AdamW's moments in page-locked host memory, copied into their
//! staging buffers and back on a copy stream inside the step's captured graph. An offloaded
//! step trains to the same losses and optimizer state, bit for bit, as the same step without
//! offload (the same kernels on the same bytes; only where the moments wait between steps
//! changes), takes its plan's device bytes and its plan's host bytes, allocates nothing per
//! step, and a run resumed from its parameters and moments continues as the uninterrupted one.
//!
//! Without a GPU these print why they skip and pass; with `INGOT_REQUIRE_GPU=1` a missing GPU
//! fails them. Run them one at a time (`--test-threads=1`).

#[path = "support/gpu_memory.rs"]
mod gpu_memory;

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::fit::offload::moments;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::precision::Precision;
use ingot_models as models;
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_testkit::steps::losses_and_state;
use ingot_trainer::session::{Device, Session};

const SPEC: &str = "gpt:vocab=512,d_model=64,layers=2,heads=4,d_ff=256,seq=32,batch=4";

fn gpu(serial: bool) -> Device {
    Device::Cuda(CudaOptions { ordinal: 0, serial })
}

/// A session of the GPT on the GPU in `precision`, with every AdamW moment offloaded when
/// `offload`.
fn session(precision: Precision, offload: bool, serial: bool) -> Session {
    let m = models::by_name(SPEC).unwrap();
    let mut opts = Options {
        precision: Some(precision),
        ..Options::for_target(Target::Cuda)
    };
    let step = StepOptions::default();
    if offload {
        let plain = pipeline::compile_observed_with(&m, &step, &opts, &mut |_| {}).unwrap();
        opts.plan.offload = moments(&plain.graph);
        assert!(!opts.plan.offload.is_empty(), "the GPT trains with AdamW");
    }
    let c = pipeline::compile_observed_with(&m, &step, &opts, &mut |_| {}).unwrap();
    assert_eq!(c.plan.offload.len(), opts.plan.offload.len());
    let exe = c.executable(Target::Cuda).unwrap();
    Session::from_executable(exe, 5, gpu(serial)).unwrap()
}

#[test]
fn an_offloaded_step_on_the_gpu_trains_bit_for_bit_as_the_step_without_offload() {
    if !cuda::gpu_for_test("offloaded step on the GPU") {
        return;
    }
    for precision in [Precision::F32, Precision::Bf16] {
        let (l0, s0) = losses_and_state(&mut session(precision, false, false), 6);
        let mut off = session(precision, true, false);
        let (l1, s1) = losses_and_state(&mut off, 6);
        eprintln!(
            "{precision:?}: losses {:?}",
            l1.iter().map(|b| f64::from_bits(*b)).collect::<Vec<_>>()
        );
        assert_eq!(l0, l1, "{precision:?}: the losses differ");
        assert_eq!(s0, s1, "{precision:?}: the optimizer state differs");
        // The moments moved: they are not zeros after six updates.
        assert!(s1
            .iter()
            .any(|(n, b)| n.ends_with(".exp_avg_sq") && b.iter().any(|&x| x != 0)));
        // Captured as one chain on the step's stream (the copies on it too): the same again.
        let (l2, s2) = losses_and_state(&mut session(precision, true, true), 6);
        assert_eq!(
            (l0, s0),
            (l2, s2),
            "{precision:?}: the serial capture differs"
        );
    }
}

#[test]
fn an_offloaded_step_on_the_gpu_takes_its_planned_device_and_host_bytes_and_allocates_nothing() {
    if !cuda::gpu_for_test("offloaded step's memory") {
        return;
    }
    let mut off = session(Precision::Bf16, true, false);
    let plain = session(Precision::Bf16, false, false);
    let plan = off.exe().plan().clone();
    let m = off.cuda().unwrap().memory();
    assert!(plan.host_bytes > 0);
    assert_eq!(m.pinned_host, plan.host_bytes, "host bytes planned = held");
    assert_eq!(plain.cuda().unwrap().memory().pinned_host, 0);
    assert!(plan.total_bytes < plain.exe().plan().total_bytes);
    gpu_memory::takes_its_plan_and_allocates_nothing(&mut off, 20);
}

#[test]
fn an_offloaded_run_resumed_from_its_parameters_and_moments_continues_bit_for_bit() {
    if !cuda::gpu_for_test("offloaded resume") {
        return;
    }
    let mut whole = session(Precision::F32, true, false);
    losses_and_state(&mut whole, 3);
    let params = whole.parameters();
    let state = whole.optimizer_state();
    let mut resumed = session(Precision::F32, true, false);
    resumed.load_parameters(&params).unwrap();
    resumed.load_optimizer_state(&state).unwrap();
    // What was written reads back from the homes exactly.
    assert_eq!(resumed.optimizer_state(), state);
    let (a, sa) = losses_and_state(&mut whole, 3);
    let (b, sb) = losses_and_state(&mut resumed, 3);
    assert_eq!(a, b, "the resumed run's losses differ");
    assert_eq!(sa, sb, "the resumed run's moments differ");
}
