//! Prints the memory report of a model's training step: `cargo run --release -p ingot-compiler --example plan_model -- gpt2`
fn main() {
    let spec = std::env::args().nth(1).unwrap_or_else(|| "mlp".into());
    let t = std::time::Instant::now();
    match ingot_models::compile_model(&spec, &Default::default()) {
        Ok(c) => {
            print!("{}", c.report.table());
            if let Ok(path) = std::env::var("INGOT_DUMP_DSA") {
                // The slab's interval problem, in MiniMalloc's CSV format, for `ingot dsa`.
                let mut csv = String::from("id,lower,upper,size\n");
                for (i, s) in c.plan.liveness.storages.iter().enumerate() {
                    if s.region == ingot_compiler::plan::Region::Slab {
                        csv += &format!(
                            "{i},{},{},{}\n",
                            s.start,
                            s.end.max(s.start + 1),
                            ingot_compiler::plan::align_up(s.bytes)
                        );
                    }
                }
                std::fs::write(path, csv).expect("write the dump");
            }
            eprintln!("compiled in {:.3} s", t.elapsed().as_secs_f64());
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
