//! The text form round-trips every reference model, forward graph and whole training step:
//! parse(print(g)) == g, and printing again gives the same text.

use ingot_compiler::autodiff::training_step;
use ingot_compiler::ir::{text, Graph};

fn round_trips(name: &str, g: &Graph) {
    let printed = text::print(g);
    let parsed = text::parse(&printed)
        .unwrap_or_else(|e| panic!("{name}: the printed form does not parse: {e}"));
    assert!(parsed == *g, "{name}: parse(print(g)) differs from g");
    assert_eq!(
        text::print(&parsed),
        printed,
        "{name}: printing twice gives different text"
    );
}

#[test]
fn every_reference_model_and_its_training_step_round_trip_through_text() {
    for spec in [
        "mlp",
        "gpt-mini",
        "gpt2",
        "gpt:vocab=97,d_model=24,layers=1,heads=3,d_ff=40,seq=5,batch=2",
    ] {
        let m = ingot_models::by_name(spec).unwrap();
        round_trips(spec, &m.graph);
        let step = training_step(&m.graph, &m.optimizer).unwrap();
        round_trips(&format!("{spec} step"), &step.graph);
    }
}
