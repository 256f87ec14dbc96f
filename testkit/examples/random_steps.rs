//! Checks the random training steps of a range of seeds (`ingot_compiler::random_graph`) on the
//! CPU against the unfused reference interpreter, and prints each failure and a summary:
//!
//!     cargo run --release -p ingot-testkit --example random_steps -- FIRST_SEED END_SEED
use ingot_testkit::random_step::check_cpu;

fn main() {
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
