//! The Rust code of docs/user-guide.md, run as tests so the guide stays true.

use ingot_compiler::autodiff::Optimizer;
use ingot_compiler::ir::text;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_compiler::precision::Precision;
use ingot_compiler::snapshot::plan_snapshot;
use ingot_trainer::session::{Device, Session};

/// The guide's classifier is the example's, compiled in here (its own tests run here too).
#[allow(dead_code)]
#[path = "../examples/define_model.rs"]
mod define_model;
use define_model::my_classifier;

#[test]
fn a_model_defined_in_rust_plans_and_trains() {
    let model = my_classifier().unwrap();

    // Plan: the report before anything runs.
    let compiled = pipeline::compile(&model, &Device::Cpu.options()).unwrap();
    print!("{}", compiled.report.table());

    // Train on the CPU: one allocation of exactly the planned size, then steps.
    let mut session = Session::new(&model, 0).unwrap();
    assert_eq!(session.exe().allocated_bytes(), compiled.report.total_bytes);
    let first = session.step().unwrap().loss;
    let mut last = first;
    for _ in 0..20 {
        last = session.step().unwrap().loss;
    }
    assert!(last < first, "the loss falls: {first} -> {last}");

    // Snapshot the same plan, and hold it to a budget.
    let snap = plan_snapshot(&model, &Device::Cpu.options()).unwrap();
    assert_eq!(snap.total_bytes, compiled.report.total_bytes);
    snap.assert_within(1 << 20).unwrap();
}

#[test]
fn a_model_in_ir_text_plans() {
    let graph = text::parse(include_str!("../../docs/examples/tiny-mlp.ir")).unwrap();
    let model = Model {
        name: "tiny-mlp".into(),
        graph,
        eval_graph: None,
        optimizer: Optimizer::Sgd { lr: 0.1 },
        precision: Precision::F32,
    };
    let snap = plan_snapshot(&model, &Device::Cpu.options()).unwrap();
    assert!(snap.total_bytes > 0);
}

/// The files whose code docs/user-guide.md shows.
const SOURCES: [(&str, &str); 5] = [
    (
        "examples/define_model.rs",
        include_str!("../examples/define_model.rs"),
    ),
    (
        "examples/plan_ir_text.rs",
        include_str!("../examples/plan_ir_text.rs"),
    ),
    (
        "examples/train_cpu.rs",
        include_str!("../examples/train_cpu.rs"),
    ),
    ("tests/plan_snapshot.rs", include_str!("plan_snapshot.rs")),
    ("tests/user_guide.rs", include_str!("user_guide.rs")),
];

/// The lines of each ```rust block of `markdown`, trimmed, blank lines left out.
fn rust_blocks(markdown: &str) -> Vec<Vec<&str>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim()) {
            (None, "```rust") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap()),
            (Some(b), l) if !l.is_empty() => b.push(l),
            _ => {}
        }
    }
    blocks
}

/// Whether `block`'s lines appear in `source`, in order (the guide may leave lines out).
fn shown_in(block: &[&str], source: &str) -> bool {
    let mut lines = source.lines().map(str::trim);
    block.iter().all(|want| lines.any(|l| l == *want))
}

#[test]
fn every_rust_block_of_the_guide_is_in_an_example_file() {
    let guide = include_str!("../../docs/user-guide.md");
    let blocks = rust_blocks(guide);
    assert!(
        blocks.len() >= 4,
        "the guide has its Rust blocks: {}",
        blocks.len()
    );
    for block in &blocks {
        assert!(
            SOURCES.iter().any(|(_, src)| shown_in(block, src)),
            "this block of docs/user-guide.md is in none of {:?}; make the guide and the code agree:\n{}",
            SOURCES.map(|(name, _)| name),
            block.join("\n")
        );
    }
}

#[test]
fn a_changed_line_is_caught_by_the_guide_check() {
    let block = ["let mut g = Graph::new();", "let h = nn::relu(&mut g, h)?;"];
    assert!(shown_in(&block, SOURCES[0].1));
    assert!(!shown_in(&["let h = nn::gelu(&mut g, h)?;"], SOURCES[0].1));
    // Order matters: lines shown out of order are not the file's code.
    assert!(!shown_in(&[block[1], block[0]], SOURCES[0].1));
}
