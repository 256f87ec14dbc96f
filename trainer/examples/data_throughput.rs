//! How fast the data path fills batches: the loader thread over a token file of a few million
//! random tokens, cutting a model's `[batch, seq]` rows at random offsets, consumed as fast as
//! it can fill them (no step in between). The time per batch is what a step must hide.
//!
//! `cargo run --release -p ingot-trainer --example data_throughput -- gpt-mini gpt2 [TOKENS]`
use ingot_trainer::data::{BatchSource, Epochs, Loader, Order, Staging, TokenBatches, TokenStream};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tokens: u64 = args
        .iter()
        .find_map(|a| a.parse().ok())
        .unwrap_or(4_000_000);
    let path = std::env::temp_dir().join(format!("ingot-throughput-{}.bin", std::process::id()));
    // A linear congruential sequence below 8192 (gpt-mini's vocabulary): random enough, no dependency.
    let mut state = 12345u64;
    let bytes: Vec<u8> = (0..tokens)
        .flat_map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((state >> 33) % 8192) as u16).to_le_bytes()
        })
        .collect();
    std::fs::write(&path, bytes).expect("write the token file");
    println!("| model | x | batches | µs per batch | tokens per second |");
    println!("|---|---|---:|---:|---:|");
    for spec in args.iter().filter(|a| a.parse::<u64>().is_err()) {
        let g = ingot_models::by_name(spec).expect("model").graph;
        let src = TokenBatches::for_graph(
            TokenStream::open(&path).expect("open"),
            &g,
            Order::Random,
            0,
        )
        .expect("batches");
        let (xs, ys) = (src.x().clone(), src.y().clone());
        let per_batch = (xs.dims[0] * xs.dims[1]) as f64;
        let buffers = [0, 1].map(|_| Staging {
            x: vec![0u8; xs.bytes()],
            y: vec![0u8; ys.bytes()],
        });
        let mut loader = Loader::spawn(Epochs::new(src), buffers).expect("loader");
        let n = 2000;
        let start = Instant::now();
        for _ in 0..n {
            let b = loader.next_batch().expect("batch").expect("no end");
            std::hint::black_box(&b.x);
        }
        let s = start.elapsed().as_secs_f64();
        println!(
            "| {spec} | {:?} | {n} | {:.1} | {:.3e} |",
            xs.dims,
            s / n as f64 * 1e6,
            per_batch * n as f64 / s
        );
    }
    let _ = std::fs::remove_file(&path);
}
