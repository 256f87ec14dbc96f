//! Checks the random training steps of a range of seeds (`ingot_compiler::random_graph`) on the
//! CPU against the unfused reference interpreter, and prints each failure and a summary:
//!
//!     cargo run --release -p ingot-testkit --example random_steps -- FIRST_SEED END_SEED
//!
//! or prints one seed's model (precision, optimizer, micro-batches and forward graph as IR text),
//! to read a failure:
//!
//!     cargo run --release -p ingot-testkit --example random_steps -- show SEED
use ingot_compiler::random_graph;
use ingot_testkit::random_step::check_cpu;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [show, seed] = &args[..] {
        if show == "show" {
            let Ok(seed) = seed.parse::<u64>() else {
                eprintln!("usage: random_steps show SEED");
                std::process::exit(2);
            };
            match random_graph::model(seed) {
                Ok(m) => println!(
                    "# {} {:?} {:?}, {} micro-batches\n{}",
                    m.name,
                    m.precision,
                    m.optimizer,
                    random_graph::micro_batches(seed),
                    m.graph
                ),
                Err(e) => {
                    eprintln!("random:{seed}: generator: {e}");
                    std::process::exit(1);
                }
            }
            return;
        }
    }
    let a: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    let (lo, hi) = match a[..] {
        [lo, hi] if lo < hi => (lo, hi),
        _ => {
            eprintln!("usage: random_steps FIRST_SEED END_SEED");
            std::process::exit(2);
        }
    };
    let (mut fails, mut worst) = (0u64, 0f64);
    for seed in lo..hi {
        // A line every 5,000 seeds, so a run stopped by a time limit still says how far it got.
        if seed > lo && (seed - lo).is_multiple_of(5000) {
            println!(
                "progress: {} seeds, {fails} failures, largest difference {worst:.6} of the tolerance",
                seed - lo
            );
        }
        match std::panic::catch_unwind(|| check_cpu(seed)) {
            Ok(Ok(o)) => worst = worst.max(o.worst),
            Ok(Err(e)) => {
                fails += 1;
                println!("seed {seed}: {e}");
            }
            Err(_) => {
                fails += 1;
                println!("seed {seed}: panicked");
            }
        }
    }
    println!(
        "{} seeds, {fails} failures, largest difference {worst:.6} of the tolerance",
        hi - lo
    );
    std::process::exit(i32::from(fails > 0));
}
