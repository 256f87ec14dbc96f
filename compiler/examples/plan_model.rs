//! Prints the memory report of a model's training step: `cargo run --release -p ingot-compiler --example plan_model -- gpt2`
fn main() {
    let spec = std::env::args().nth(1).unwrap_or_else(|| "mlp".into());
    let t = std::time::Instant::now();
    match ingot_compiler::pipeline::compile_model(&spec, &Default::default()) {
        Ok(c) => {
            print!("{}", c.report.table());
            eprintln!("compiled in {:.3} s", t.elapsed().as_secs_f64());
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
