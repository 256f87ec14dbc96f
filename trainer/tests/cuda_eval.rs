//! On a GPU, the evaluation step in the training step's allocation (issue 18): one device
//! allocation of the pair's total, nothing allocated by training or evaluating, and the
//! evaluation losses those of a separately compiled forward-only step. Without a GPU these print
//! why they skip and pass; with `INGOT_REQUIRE_GPU=1` a missing GPU fails them.

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::exe::Target;
use ingot_compiler::pipeline;
use ingot_models::by_name;
use ingot_runtime::cuda::{self, CudaOptions};
use ingot_trainer::eval::{forward_step, pair_with_eval};
use ingot_trainer::session::{Device, Session};

const STRICT: Device = Device::Cuda(CudaOptions {
    ordinal: 0,
    serial: false,
});

fn batch(s: &Session, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let b = ingot_trainer::init::synthetic_batch(s.graph(), seed);
    (b["x"].to_le_bytes(), b["y"].to_le_bytes())
}

#[test]
fn on_the_gpu_the_shared_eval_step_takes_one_allocation_and_matches_a_separate_one() {
    if !cuda::gpu_for_test("shared eval step") {
        return;
    }
    let model = by_name("gpt-mini").unwrap();
    let opts = STRICT.options();
    let step = StepOptions {
        step_input: true,
        ..Default::default()
    };
    let train = pipeline::compile_observed_with(&model, &step, &opts, &mut |_| {})
        .unwrap()
        .executable(Target::Cuda)
        .unwrap();
    let pair = pair_with_eval(&model, train, &opts).unwrap();
    let layout = pair.layout();
    let mut s = Session::from_pair(pair, 1, STRICT).unwrap();
    let m = s.cuda().unwrap().memory();
    assert_eq!(
        m.requested, layout.total_bytes,
        "one allocation of the pair's total"
    );
    assert!(
        m.allocation >= layout.total_bytes && m.allocation < layout.total_bytes + (2 << 20),
        "allocation took {} bytes for {}",
        m.allocation,
        layout.total_bytes
    );
    let alone = pipeline::compile_step("eval", forward_step(&model.graph), &opts)
        .unwrap()
        .executable(Target::Cuda)
        .unwrap();
    let mut alone = Session::from_executable(alone, 1, STRICT).unwrap();
    let (slots, aslots) = (s.input_slots().unwrap(), alone.input_slots().unwrap());
    let (x, y) = batch(&s, 7);
    s.step_on(&slots, &x, &y).unwrap();
    s.eval_on(&x, &y).unwrap();
    let before = s.cuda().unwrap().free_memory().unwrap();
    let mut bit_equal = true;
    for round in 0..5u64 {
        for k in 0..20 {
            let (x, y) = batch(&s, 100 + round * 20 + k);
            s.step_on(&slots, &x, &y).unwrap();
        }
        alone.load_parameters(&s.parameters()).unwrap();
        let (x, y) = batch(&s, 1000 + round);
        let got = s.eval_on(&x, &y).unwrap();
        let want = alone.step_on(&aslots, &x, &y).unwrap().loss;
        bit_equal &= got.to_bits() == want.to_bits();
        assert!(
            (got - want).abs() <= 1e-6 * want.abs(),
            "round {round}: shared {got} vs alone {want}"
        );
    }
    eprintln!("shared eval losses bit-equal to the separate step's: {bit_equal}");
    let after = s.cuda().unwrap().free_memory().unwrap();
    assert_eq!(
        before, after,
        "free device memory moved while training and evaluating"
    );
}

#[test]
fn a_pair_lowered_for_the_cpu_is_refused_by_the_gpu_naming_the_target() {
    let model = by_name("mlp").unwrap();
    let opts = Session::cpu_options();
    let train = pipeline::compile(&model, &opts)
        .unwrap()
        .executable(Target::Cpu)
        .unwrap();
    let pair = pair_with_eval(&model, train, &opts).unwrap();
    let e = Session::from_pair(pair.clone(), 0, STRICT)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("--device cuda"), "{e}");
    // Before anything touches a GPU: the program is not a CUDA one.
    let e = cuda::CudaStep::pair(pair, CudaOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("not CUDA"), "{e}");
}
