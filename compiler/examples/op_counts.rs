//! Op counts of each reference model's training step, by phase:
//! `cargo run --release -p ingot-compiler --example op_counts`
use ingot_compiler::autodiff;

fn main() {
    println!("| model | forward ops | backward ops | optimizer ops | total | parameters |");
    println!("|---|---:|---:|---:|---:|---:|");
    for spec in ["mlp", "gpt-mini", "gpt2"] {
        let m = ingot_models::by_name(spec).expect("reference model builds");
        let s = autodiff::training_step(&m.graph, &m.optimizer).expect("training step builds");
        let p = &s.phases;
        println!(
            "| {spec} | {} | {} | {} | {} | {} |",
            p.forward.len(),
            p.backward.len(),
            p.optimizer.len(),
            s.graph.len(),
            ingot_compiler::model::parameter_count(&m.graph)
        );
    }
}
