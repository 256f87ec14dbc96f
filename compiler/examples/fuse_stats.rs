//! Kernels per step and planned totals before and after rewriting and fusion.
//!
//! `cargo run --release -p ingot-compiler --example fuse_stats [MODEL...]`

use ingot_compiler::autodiff::training_step;
use ingot_compiler::fuse::{fuse, FuseOptions};
use ingot_compiler::plan::{self, PlanOptions};
use ingot_compiler::report::Report;
use ingot_compiler::rewrite;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let specs: Vec<String> = if args.is_empty() {
        vec!["mlp".into(), "gpt-mini".into(), "gpt2".into()]
    } else {
        args
    };
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    for spec in &specs {
        let model = ingot_models::by_name(spec).expect("model");
        let step = training_step(&model.graph, &model.optimizer).expect("step");
        let before = plan::plan(&step.graph, &PlanOptions::default()).expect("plan");
        let rb = Report::new(spec, &step.graph, &before, None);
        let t = Instant::now();
        let (rw, rr) = rewrite::simplify(&step.graph, &Default::default()).expect("rewrite");
        let t_rw = t.elapsed();
        let t = Instant::now();
        let fused = fuse(&rw, &FuseOptions::default()).expect("fuse");
        let t_fuse = t.elapsed();
        let after = plan::plan(&fused.graph, &PlanOptions::default()).expect("plan");
        let loss = fused.graph.outputs.get("loss").copied();
        let ph = ingot_compiler::autodiff::phase::of_graph(&fused.graph, loss);
        let ra = Report::new(spec, &fused.graph, &after, Some(&ph));
        println!(
            "{spec}: kernels {} -> {} ({} fused, {} library, {} multi-output, {} recomputed); total {:.1} -> {:.1} MiB (LOAD {:.1}); rewrite {} -> {} nodes in {:.2?} ({}), fuse {:.2?}",
            rb.kernels,
            ra.kernels,
            fused.report.fused_kernels,
            fused.report.library_calls,
            fused.report.multi_output_kernels,
            fused.report.recomputed,
            mib(before.total_bytes),
            mib(after.total_bytes),
            mib(after.load_bytes),
            rr.nodes_before,
            rr.nodes_after,
            t_rw,
            rr.stop_reason,
            t_fuse,
        );
        println!("{}", ra.table());
        if let Ok(ids) = std::env::var("INGOT_SHOW") {
            for id in ids.split(',').filter_map(|s| s.parse().ok()) {
                show(&fused.graph, id);
            }
        }
    }
}

/// Prints the kernel writing node `id` of the fused graph (debugging aid: `INGOT_SHOW=186`).
fn show(g: &ingot_compiler::ir::Graph, id: u32) {
    let n = g.node(ingot_compiler::ir::NodeId(id));
    if let ingot_compiler::ir::Op::Fused(k) = &n.op {
        println!("%{id}: inputs {:?}\n{}", n.inputs, k);
    }
}
