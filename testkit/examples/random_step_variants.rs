//! One random step checked four ways, to tell which pass moves its numbers: compiled as the CPU
//! session compiles it, without the rewrite, without fusion, and without either:
//!
//!     cargo run --release -p ingot-testkit --example random_step_variants -- SEED
//!
//! or, with `rules`, compiled with the rewrite and without fusion, once per rewrite rule left
//! out, to tell which rule moves them:
//!
//!     cargo run --release -p ingot-testkit --example random_step_variants -- SEED rules
use ingot_compiler::random_graph;
use ingot_testkit::random_step::check_model_compiled_with;
use ingot_trainer::session::Session;

fn main() {
    let Some(seed) = std::env::args().nth(1).and_then(|s| s.parse::<u64>().ok()) else {
        eprintln!("usage: random_step_variants SEED");
        std::process::exit(2);
    };
    let m = match random_graph::model(seed) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("random:{seed}: generator: {e}");
            std::process::exit(1);
        }
    };
    let step = random_graph::step_options(seed);
    if std::env::args().nth(2).as_deref() == Some("rules") {
        for rule in ingot_compiler::rewrite::rules::all() {
            let mut opts = Session::cpu_options();
            opts.fuse = None;
            if let Some(r) = opts.rewrite.as_mut() {
                r.without = vec![rule.name.to_string()];
            }
            match check_model_compiled_with(&m, &step, &opts, seed) {
                Ok(o) => println!(
                    "without {}: passes, {:.4} of the tolerance",
                    rule.name, o.worst
                ),
                Err(e) => println!("without {}: {e}", rule.name),
            }
        }
        return;
    }
    for (what, rewrite, fuse) in [
        ("rewrite and fusion", true, true),
        ("fusion only", false, true),
        ("rewrite only", true, false),
        ("neither", false, false),
    ] {
        let mut opts = Session::cpu_options();
        if !rewrite {
            opts.rewrite = None;
        }
        if !fuse {
            opts.fuse = None;
        }
        match check_model_compiled_with(&m, &step, &opts, seed) {
            Ok(o) => println!("{what}: passes, {:.4} of the tolerance", o.worst),
            Err(e) => println!("{what}: {e}"),
        }
    }
}
