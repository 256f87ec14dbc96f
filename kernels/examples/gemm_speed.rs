//! Speed of [`gemm_ws`](ingot_kernels::cpu::gemm_ws) (packing into a caller-provided workspace,
//! no heap allocation) against the `matrixmultiply` path of `cpu::matmul`, side by side, single
//! products of f32 (and f64) in every transpose combination that matters.
//!
//! ```text
//! cargo run --release -p ingot-kernels --example gemm_speed
//! ```
//!
//! Each line is the best and the median of 15 timed runs after one warm-up, the two products
//! alternating. `gemm_ws` is always single-threaded; `matrixmultiply` may use a second thread
//! unless `MATMUL_NUM_THREADS=1`, which is the fair comparison (on the development VM the two
//! vCPUs share one core, so its second thread helps only while the sibling happens to be idle).
//!
//! Measured on the 2-vCPU development VM (Xeon, AVX-512; `MATMUL_NUM_THREADS=1`; best of 15, in
//! GFLOP/s; the VM is shared, so medians wander):
//!
//! | product | matmul | gemm_ws |
//! |---|---|---|
//! | f32 1024³ NN / NT / TN | 125 / 127 / 123 | 118 / 123 / 126 |
//! | f32 256×784×1024 NN / NT / TN | 120 / 123 / 128 | 124 / 121 / 131 |
//! | f32 256×1024×10 | 40 | 49 |
//! | f32 64³ | 96 | 89 |
//! | f64 1024³ / 256×784×1024 | 53 / 49 | 55 / 54 |

use ingot_kernels::cpu::gemm::{kernel_name, workspace_bytes};
use ingot_kernels::cpu::{batched_matmul, batched_matmul_ws, workspace_len, GemmScalar, Trans};
use std::time::Instant;

/// Best and median seconds of `runs` calls each of `f` and `g`, after one warm-up call each.
/// The calls alternate, so a machine whose load changes during the run slows both alike.
fn time_pair(runs: usize, mut f: impl FnMut(), mut g: impl FnMut()) -> [(f64, f64); 2] {
    f();
    g();
    let mut secs = [Vec::with_capacity(runs), Vec::with_capacity(runs)];
    for _ in 0..runs {
        let t = Instant::now();
        f();
        secs[0].push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        g();
        secs[1].push(t.elapsed().as_secs_f64());
    }
    secs.map(|mut s| {
        s.sort_by(|x, y| x.total_cmp(y));
        (s[0], s[runs / 2])
    })
}

#[allow(clippy::too_many_arguments)]
fn row<T: GemmScalar>(
    name: &str,
    (m, k, n): (usize, usize, usize),
    ta: Trans,
    tb: Trans,
    from: impl Fn(f64) -> T,
) {
    let a: Vec<T> = (0..m * k)
        .map(|i| from(((i * 7) % 13) as f64 * 0.1 - 0.6))
        .collect();
    let b: Vec<T> = (0..k * n)
        .map(|i| from(((i * 5) % 11) as f64 * 0.1 - 0.5))
        .collect();
    let (mut c_mm, mut c_ws) = (vec![T::ZERO; m * n], vec![T::ZERO; m * n]);
    let mut ws = vec![T::ZERO; workspace_len::<T>(m, k, n)];
    let flops = 2.0 * (m * k * n) as f64;
    let runs = 15;
    let [(mm_best, mm_med), (ws_best, ws_med)] = time_pair(
        runs,
        || batched_matmul(1, m, k, n, &a, ta, &b, tb, &mut c_mm, false),
        || batched_matmul_ws(1, m, k, n, &a, ta, &b, tb, &mut c_ws, false, &mut ws).unwrap(),
    );
    let g = |s: f64| flops / s / 1e9;
    println!(
        "| {name:<7} | {m}x{k}x{n} {:?}{:?} | {:6.1} | {:6.1} | {:6.1} | {:6.1} | {:4.0}% | {:7.1} KiB |",
        ta,
        tb,
        g(mm_best),
        g(mm_med),
        g(ws_best),
        g(ws_med),
        100.0 * mm_best / ws_best,
        workspace_bytes::<T>(m, k, n) as f64 / 1024.0
    );
}

fn main() {
    println!(
        "gemm_ws kernel: {}; {} logical CPUs; MATMUL_NUM_THREADS={}",
        kernel_name(),
        std::thread::available_parallelism().map_or(1, |p| p.get()),
        std::env::var("MATMUL_NUM_THREADS").unwrap_or_else(|_| "(unset)".into())
    );
    println!("GFLOP/s, best and median of 15 runs:\n");
    println!("| type | m x k x n, op | matmul best | matmul median | gemm_ws best | gemm_ws median | ws/mm | workspace |");
    println!("|---|---|---|---|---|---|---|---|");
    let f32_ = |v: f64| v as f32;
    for &(ta, tb) in &[
        (Trans::N, Trans::N),
        (Trans::N, Trans::T),
        (Trans::T, Trans::N),
    ] {
        row::<f32>("f32", (1024, 1024, 1024), ta, tb, f32_);
        row::<f32>("f32", (256, 784, 1024), ta, tb, f32_);
    }
    row::<f32>("f32", (256, 1024, 10), Trans::N, Trans::N, f32_);
    row::<f32>("f32", (64, 64, 64), Trans::N, Trans::N, f32_);
    row::<f64>("f64", (1024, 1024, 1024), Trans::N, Trans::N, |v| v);
    row::<f64>("f64", (256, 784, 1024), Trans::N, Trans::N, |v| v);
}
