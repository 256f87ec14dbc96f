//! What the rewrite pass does to each reference model's training step:
//! `cargo run --release -p ingot-compiler --example rewrite_stats [MODEL...]`
use ingot_compiler::autodiff;
use ingot_compiler::rewrite::{simplify, RewriteOptions};
use std::time::Instant;

fn mib(b: usize) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let specs: Vec<String> = if args.is_empty() {
        ["mlp", "gpt-mini", "gpt2"].map(String::from).to_vec()
    } else {
        args
    };
    let verbose = std::env::var_os("VERBOSE").is_some();
    println!(
        "| model | nodes before | nodes after | MiB before | MiB after | e-nodes | e-classes | iterations | stop reason | time |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    for spec in &specs {
        let m = ingot_models::by_name(spec).expect("model builds");
        let s = autodiff::training_step(&m.graph, &m.optimizer).expect("training step builds");
        let t = Instant::now();
        let (g, r) = simplify(&s.graph, &RewriteOptions::default()).expect("rewrite succeeds");
        let took = t.elapsed();
        println!(
            "| {spec} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {:.2} s |",
            r.nodes_before,
            r.nodes_after,
            mib(r.bytes_before),
            mib(r.bytes_after),
            r.egraph_nodes,
            r.egraph_classes,
            r.iterations,
            r.stop_reason,
            took.as_secs_f64()
        );
        if verbose {
            eprintln!("{spec}: {r}");
            eprintln!("before: {:?}", s.graph.op_histogram());
            eprintln!("after:  {:?}", g.op_histogram());
        }
    }
}
