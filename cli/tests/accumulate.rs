//! Gradient accumulation (`StepOptions::accumulate`): a step of K micro-batches of b samples
//! trains as the step of one batch of K·b (the same losses and parameters within float
//! rounding), and its plan is smaller.

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::{DType, LeafKind};
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;

#[path = "support/cli.rs"]
mod cli;
#[path = "../../trainer/tests/support/steps.rs"]
mod steps;

fn compile(model: &Model, accumulate: usize) -> Executable {
    let step = StepOptions {
        accumulate,
        ..Default::default()
    };
    steps::compile(model, step, Target::Cpu)
}

/// `steps` steps of `spec` at batch `k * b`, whole and as `k` accumulated micro-batches of `b`,
/// from the same parameters and batches: the largest relative difference of a loss and of a
/// parameter.
fn accumulated_against_whole(spec: &str, sgd: bool, k: usize, b: usize, steps: u64) -> (f64, f64) {
    let at = |batch: usize| {
        let m = ingot_models::at_batch(spec, batch, DType::F32).unwrap();
        if sgd {
            steps::with_sgd(m)
        } else {
            m
        }
    };
    let whole = compile(&at(k * b), 1);
    let accumulated = compile(&at(b), k);
    // The micro-batches' weight gradients are summed by their GEMMs (`matmul_acc`).
    let what = format!("{spec}, {k} micro-batches");
    let kinds = [LeafKind::Parameter, LeafKind::State];
    steps::split_against_whole(&what, accumulated, whole, &kinds, steps)
}

/// Asserts that `k` accumulated micro-batches of `b` train `spec` as its whole batch: losses and
/// parameters within 1e-6 relative over 10 steps.
fn assert_accumulated_as_whole(spec: &str, sgd: bool, k: usize, b: usize) {
    let (loss, param) = accumulated_against_whole(spec, sgd, k, b, 10);
    assert!(
        loss <= 1e-6 && param <= 1e-6,
        "{spec} (SGD: {sgd}): loss {loss:.2e}, parameters {param:.2e}"
    );
}

#[test]
fn four_accumulated_micro_batches_train_an_mlp_as_the_whole_batch() {
    assert_accumulated_as_whole("mlp", true, 4, 2);
}

#[test]
fn two_accumulated_micro_batches_train_a_gpt_as_the_whole_batch() {
    let spec = "gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch=4";
    let (loss, param) = accumulated_against_whole(spec, false, 2, 2, 10);
    // AdamW: as in data_parallel.rs, a gradient that is zero in exact arithmetic (the key bias)
    // is rounding noise that AdamW scales to a step of either sign; the losses stay close.
    assert!(loss <= 1e-6, "loss {loss:.2e} (parameters {param:.2e})");
    assert_accumulated_as_whole(spec, true, 2, 2);
}

#[test]
fn accumulating_more_micro_batches_plans_less_memory_for_the_same_batch() {
    let spec = "gpt:vocab=256,d_model=64,layers=2,heads=4,d_ff=256,seq=64,batch=16";
    let totals: Vec<usize> = [1usize, 2, 4, 8]
        .iter()
        .map(|&k| {
            let m = ingot_models::at_batch(spec, 16 / k, DType::F32).unwrap();
            let exe = compile(&m, k);
            let x = exe.graph().leaf("x").unwrap();
            assert_eq!(
                exe.graph().ty(x).shape.dims()[0],
                16,
                "the step takes the whole batch"
            );
            exe.plan().total_bytes
        })
        .collect();
    for w in totals.windows(2) {
        assert!(w[1] < w[0], "{totals:?}");
    }
}

#[test]
fn each_micro_batch_recomputes_its_own_cheap_values_for_its_own_backward_pass() {
    let spec = "gpt:vocab=256,d_model=64,layers=2,heads=4,d_ff=256,seq=64,batch=8";
    let recomputed = |k: usize| {
        let m = ingot_models::at_batch(spec, 8 / k, DType::F32).unwrap();
        let step = StepOptions {
            accumulate: k,
            ..Default::default()
        };
        pipeline::compile_observed_with(
            &m,
            &step,
            &pipeline::Options::for_target(Target::Cpu),
            &mut |_| {},
        )
        .unwrap()
        .fuse
        .expect("fusion ran")
        .recomputed
    };
    let one = recomputed(1);
    assert!(one > 0);
    for k in [2, 4] {
        // Each micro-batch's own values, and its slice of the batch's ids (a view the
        // embedding's gradient reads again), which the whole batch does not have.
        assert_eq!(recomputed(k), k * (one + 1), "{k} micro-batches");
    }
}

#[test]
fn an_accumulated_run_over_a_data_set_validates_and_resumes_exactly() {
    let dir = cli::scratch("accumulate-cli", "resume");
    let tokens = cli::letter_tokens(&dir, 6000);
    let ck = dir.join("ck");
    let (t, ck) = (cli::s(&tokens), cli::s(&ck));
    let ingot = |args: &[&str]| cli::ok(&cli::ingot(args));
    let spec = "gpt:vocab=256,d_model=32,layers=1,heads=2,d_ff=64,seq=32,batch=8";
    let losses = |out: &str| cli::step_losses(&cli::json_lines(out));
    let base = [
        "train",
        "--model",
        spec,
        "--accumulate",
        "2",
        "--dataset",
        t,
        "--json",
    ];
    let run = |more: &[&str]| ingot(&[&base[..], more].concat());
    let first = run(&[
        "--steps",
        "4",
        "--checkpoint",
        ck,
        "--val",
        t,
        "--eval-batches",
        "2",
    ]);
    assert!(first.contains("val_loss"), "{first}");
    let resumed = run(&["--steps", "6", "--resume", ck]);
    let straight = run(&["--steps", "6"]);
    let (r, s) = (losses(&resumed), losses(&straight));
    assert_eq!(r.len(), 2);
    assert_eq!(
        r[..],
        s[4..],
        "the resumed run continues the straight one bit for bit"
    );
}
