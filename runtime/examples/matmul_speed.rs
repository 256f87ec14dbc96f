//! Speed of the CPU matrix product: GFLOP/s of a 1024×1024×1024 f32 product (and f64), through
//! the same kernel the CPU executor uses.
//!
//! ```text
//! cargo run --release -p ingot-runtime --example matmul_speed
//! MATMUL_NUM_THREADS=1 cargo run --release -p ingot-runtime --example matmul_speed   # one thread
//! ```
//!
//! Measured on the 2-vCPU development VM (Xeon, AVX-512 kernel): about 130 GFLOP/s for f32
//! (best of 10; 15-17 ms), and 50 GFLOP/s for f64, with one thread or two alike: its two vCPUs
//! share one physical core (two spinning processes each run at half speed), so the second
//! thread of `matrixmultiply` adds nothing there.

use ingot_kernels::cpu::{batched_matmul, GemmScalar, Trans};
use std::time::Instant;

fn measure<T: GemmScalar>(name: &str, n: usize, ta: Trans, tb: Trans, from: impl Fn(f64) -> T) {
    let a: Vec<T> = (0..n * n)
        .map(|i| from(((i * 7) % 13) as f64 * 0.1 - 0.6))
        .collect();
    let b: Vec<T> = (0..n * n)
        .map(|i| from(((i * 5) % 11) as f64 * 0.1 - 0.5))
        .collect();
    let mut c = vec![T::ZERO; n * n];
    let flops = 2.0 * (n as f64).powi(3);
    // Warm up (thread pool start, page faults), then take the best and the median of the runs.
    batched_matmul(1, n, n, n, &a, ta, &b, tb, &mut c, false);
    let mut secs: Vec<f64> = (0..10)
        .map(|_| {
            let t = Instant::now();
            batched_matmul(1, n, n, n, &a, ta, &b, tb, &mut c, false);
            t.elapsed().as_secs_f64()
        })
        .collect();
    secs.sort_by(|x, y| x.total_cmp(y));
    println!(
        "{name:<28} best {:7.2} ms {:7.1} GFLOP/s   median {:7.2} ms {:7.1} GFLOP/s",
        secs[0] * 1e3,
        flops / secs[0] / 1e9,
        secs[5] * 1e3,
        flops / secs[5] / 1e9
    );
}

fn main() {
    let n = 1024;
    println!(
        "{n}x{n}x{n} matrix products, {} logical CPUs, MATMUL_NUM_THREADS={}",
        std::thread::available_parallelism().map_or(1, |p| p.get()),
        std::env::var("MATMUL_NUM_THREADS")
            .unwrap_or_else(|_| "(unset: physical cores, at most 4)".into())
    );
    measure::<f32>("f32 A·B", n, Trans::N, Trans::N, |v| v as f32);
    measure::<f32>("f32 A·Bᵀ (read in place)", n, Trans::N, Trans::T, |v| {
        v as f32
    });
    measure::<f32>("f32 Aᵀ·B (read in place)", n, Trans::T, Trans::N, |v| {
        v as f32
    });
    measure::<f64>("f64 A·B", n, Trans::N, Trans::N, |v| v);
}
