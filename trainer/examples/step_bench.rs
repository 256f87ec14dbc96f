//! Planned execution against the unplanned reference interpreter, side by side in one run:
//! steps alternate between the two, and the medians and their ratio are printed.
//!
//! `cargo run --release -p ingot-trainer --example step_bench -- mlp "gpt:vocab=256,d_model=64,layers=2,heads=4,d_ff=256,seq=32,batch=4"`
use indexmap::IndexMap;
use ingot_compiler::autodiff::training_step;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::plan;
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_trainer::init::{init_leaves, synthetic_batch};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    println!(
        "| model | reference interpreter ms | planned ms | planned / reference | planned bytes |"
    );
    println!("|---|---:|---:|---:|---:|");
    for spec in std::env::args().skip(1) {
        let m = ingot_models::by_name(&spec).expect("model");
        let g = training_step(&m.graph, &m.optimizer).expect("step").graph;
        let p = plan::plan(&g, &ingot_compiler::lower::Target::Cpu.plan_options()).expect("plan");
        let mut leaves: IndexMap<String, Tensor> = init_leaves(&g, LeafKind::Parameter, 1);
        leaves.extend(init_leaves(&g, LeafKind::State, 1));
        leaves.extend(synthetic_batch(&g, 1));
        let mut planned = PlannedStep::from_plan(g.clone(), p).expect("load");
        for (n, v) in &leaves {
            planned.write_leaf(n, v).unwrap();
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..21 {
            let t = Instant::now();
            let mut out = run_graph(&g, &leaves).unwrap();
            let ta = t.elapsed().as_secs_f64();
            out.apply_updates(&mut leaves);
            let t = Instant::now();
            planned.step().unwrap();
            let tb = t.elapsed().as_secs_f64();
            if i > 0 {
                a.push(ta);
                b.push(tb);
            }
        }
        let (ma, mb) = (median(a), median(b));
        println!(
            "| {spec} | {:.1} | {:.1} | {:.2} | {} |",
            ma * 1e3,
            mb * 1e3,
            mb / ma,
            planned.allocated_bytes()
        );
    }
}
