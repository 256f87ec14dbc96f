//! The weights' bf16 copies (`ingot_compiler::autodiff::copies`) on the CPU: a bf16 step that
//! keeps them trains exactly as one that casts its weights in every forward pass, and the
//! copies follow the parameters however those are written.

use ingot_compiler::autodiff::{copies, StepOptions};
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline;
use ingot_compiler::precision::Precision;
use ingot_trainer::init::{init_leaves, synthetic_batch};
use ingot_trainer::session::Session;

#[path = "support/steps.rs"]
mod steps;

const GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";

fn options() -> pipeline::Options {
    let mut o = pipeline::Options::for_target(Target::Cpu);
    o.precision = Some(Precision::Bf16);
    o
}

fn exe(cast: bool) -> Executable {
    let step = StepOptions {
        cast_weights_each_step: cast,
        ..StepOptions::default()
    };
    pipeline::compile_observed_with(
        &ingot_models::by_name(GPT).unwrap(),
        &step,
        &options(),
        &mut |_| {},
    )
    .unwrap()
    .executable(Target::Cpu)
    .unwrap()
}

fn run(cast: bool) -> steps::Run {
    let e = exe(cast);
    let g = e.graph();
    let mut state = init_leaves(g, LeafKind::Parameter, 5);
    state.extend(init_leaves(g, LeafKind::State, 5));
    let batches: Vec<_> = (0..4).map(|i| synthetic_batch(g, 40 + i)).collect();
    steps::train_planned(e, &state, &batches)
}

#[test]
fn a_bf16_step_that_keeps_weight_copies_trains_as_one_that_casts_them_to_the_bit() {
    let (kept, cast) = (run(false), run(true));
    assert!(
        kept.1.keys().any(|n| n.ends_with(copies::SUFFIX)),
        "the step keeps copies"
    );
    assert!(!cast.1.keys().any(|n| n.ends_with(copies::SUFFIX)));
    for (a, b) in kept.0.iter().zip(&cast.0) {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "losses {:?} and {:?}",
            kept.0,
            cast.0
        );
    }
    for (name, v) in &cast.1 {
        assert_eq!(kept.1[name], *v, "{name} after 4 steps");
    }
    // Each copy holds its parameter's value cast, as the next step's cast would make it.
    for (name, v) in &kept.1 {
        if let Some(p) = name.strip_suffix(copies::SUFFIX) {
            let want = ingot_trainer::init::bf16_copy(&kept.1[p]).unwrap();
            assert_eq!(*v, want, "{name}");
        }
    }
}

#[test]
fn loading_parameters_rewrites_their_copies_and_a_checkpoint_holds_no_copy() {
    let model = ingot_models::by_name(GPT).unwrap();
    let mut a = Session::with_options(&model, 1, &options()).unwrap();
    let mut b = Session::with_options(&model, 2, &options()).unwrap();
    a.step().unwrap();
    assert!(
        !a.optimizer_state()
            .keys()
            .any(|n| n.ends_with(copies::SUFFIX)),
        "copies are derived, not saved"
    );
    assert!(!a.parameters().keys().any(|n| n.ends_with(copies::SUFFIX)));
    // b takes a's parameters, state and batch: its next step is a's next step.
    b.load_parameters(&a.parameters()).unwrap();
    b.load_optimizer_state(&a.optimizer_state()).unwrap();
    b.set_batch_map(&a.batch()).unwrap();
    let (la, lb) = (a.step().unwrap().loss, b.step().unwrap().loss);
    assert_eq!(la.to_bits(), lb.to_bits(), "{la} and {lb}");
}
