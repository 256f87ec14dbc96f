//! Snapshot-testing a memory plan: copy this file into your own crate's tests/ to make CI fail
//! when a change grows the memory your training step needs.
//!
//! `plan_snapshot` compiles the step and summarises its plan: the one allocation's total, the
//! resident and slab parts, LOAD, the peak and the largest buffers live there. The summary is
//! deterministic (no timings), so the committed `.snap` files match on every machine. When a
//! change moves the plan, `cargo test` fails with a diff of the summary; review it with
//! `cargo insta review` (or rerun with `INSTA_UPDATE=always`) and commit the new snapshot.
//!
//! In your crate's Cargo.toml:
//!
//! ```toml
//! [dependencies]
//! ingot-compiler = { path = "..." }
//! ingot-models = { path = "..." }
//! ingot-trainer = { path = "..." }
//! [dev-dependencies]
//! insta = { version = "1", features = ["yaml"] }
//! ```

use ingot_compiler::model::Model;
use ingot_compiler::snapshot::{plan_snapshot, PlanSnapshot};
use ingot_trainer::session::Device;

/// The plan the CPU runtime will allocate (its matmul workspace included), as `ingot plan`
/// prints it. Use `Device::Cuda(Default::default()).options()` for the GPU's plan.
fn cpu_plan(model: &Model) -> PlanSnapshot {
    plan_snapshot(model, &Device::Cpu.options()).expect("the model compiles and plans")
}

#[test]
fn mlp_plan() {
    let model = ingot_models::by_name("mlp").unwrap();
    insta::assert_yaml_snapshot!(cpu_plan(&model));
}

#[test]
fn small_gpt_plan() {
    let model =
        ingot_models::by_name("gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2")
            .unwrap();
    insta::assert_yaml_snapshot!(cpu_plan(&model));
}

/// A model of your own, read from IR text (docs/examples/tiny-mlp.ir): the same snapshot.
#[test]
fn tiny_mlp_from_ir_text_plan() {
    let text = include_str!("../../docs/examples/tiny-mlp.ir");
    let model = Model::from_ir_text("tiny-mlp", text).expect("the file parses");
    insta::assert_yaml_snapshot!(cpu_plan(&model));
}

/// A hard ceiling as well as the snapshot: the snapshot catches any change, the budget says
/// what is never acceptable.
#[test]
fn mlp_fits_in_its_budget() {
    let model = ingot_models::by_name("mlp").unwrap();
    let budget = ingot_compiler::report::parse_size("32MiB").unwrap();
    if let Err(msg) = cpu_plan(&model).assert_within(budget) {
        panic!("{msg}");
    }
}

#[test]
fn a_budget_too_small_fails_naming_the_total_and_the_budget() {
    let model = ingot_models::by_name("mlp").unwrap();
    let snap = cpu_plan(&model);
    let budget = 1 << 20;
    let msg = snap.assert_within(budget).unwrap_err().to_string();
    println!("{msg}");
    assert!(
        msg.contains(&format!("{} bytes", snap.total_bytes)),
        "the message names the total: {msg}"
    );
    assert!(
        msg.contains("over the budget of 1.00 MiB (1048576 bytes)"),
        "the message names the budget: {msg}"
    );
    assert!(
        msg.starts_with("mlp: "),
        "the message names the model: {msg}"
    );
    assert!(snap.assert_within(snap.total_bytes).is_ok());
}

/// Invariant 5: the same model gives the same snapshot, so committed snapshots never flake.
#[test]
fn the_snapshot_is_deterministic() {
    let model =
        ingot_models::by_name("gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2")
            .unwrap();
    assert_eq!(cpu_plan(&model), cpu_plan(&model));
}
