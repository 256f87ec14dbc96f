//! Session 25: f32 GEMM on the shapes of mlp and gpt-mini, C = A·B (row-major), at a thread
//! count: ingot's packed GEMM inside a rayon pool, faer's `gemm` crate (Parallelism::Rayon(n),
//! same pool), matrixmultiply (its own threads, MATMUL_NUM_THREADS). Median of repeats, GFLOP/s.
use ingot_kernels::cpu::gemm::{gemm_ws, workspace_len};
use ingot_kernels::cpu::MatLayout;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 { v.sort_by(|a, b| a.partial_cmp(b).unwrap()); v[v.len() / 2] }

fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    median((0..reps).map(|_| { let t = Instant::now(); f(); t.elapsed().as_secs_f64() }).collect())
}

fn main() {
    let threads: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let shapes = [
        ("mlp fc1", 256, 784, 1024), ("mlp fc2", 256, 1024, 1024), ("mlp fc3", 256, 1024, 10),
        ("mlp dW fc2", 1024, 256, 1024),
        ("gpt qkv", 4096, 512, 1536), ("gpt ff1", 4096, 512, 2048), ("gpt ff2", 4096, 2048, 512),
        ("gpt head", 4096, 512, 8192), ("gpt dW ff1", 512, 4096, 2048),
        ("main-job qkv", 512, 64, 192), ("main-job ff1", 512, 64, 256),
    ];
    println!("threads {threads}");
    println!("{:<14} {:>16} {:>9} {:>9} {:>9}  identical(ingot 1 thread vs n; gemm 1 vs n)", "shape", "m x k x n", "ingot", "gemm", "mmul");
    for (name, m, k, n) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 997.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729 % 1000) as f32 - 500.0) / 991.0).collect();
        let mut c = vec![0f32; m * n];
        let mut ws = vec![0f32; workspace_len::<f32>(m, k, n)];
        let flops = 2.0 * (m * k * n) as f64;
        let reps = ((3e9 / flops) as usize).clamp(5, 200);
        let (la, lb, lc) = (MatLayout::row_major(k), MatLayout::row_major(n), MatLayout::row_major(n));
        let mut ingot = |c: &mut [f32], ws: &mut [f32]| gemm_ws(m, k, n, 1.0, &a, la, &b, lb, 0.0, c, lc, ws).unwrap();
        let t_ingot = pool.install(|| time(reps, || ingot(&mut c, &mut ws)));
        let c_ingot_n = c.clone();
        ingot(&mut c, &mut ws); // outside the pool: one thread
        let ingot_same = c == c_ingot_n;
        let mut g = |c: &mut [f32], par: gemm::Parallelism| unsafe {
            gemm::gemm(m, n, k, c.as_mut_ptr(), 1, n as isize, false, a.as_ptr(), 1, k as isize,
                b.as_ptr(), 1, n as isize, 0.0f32, 1.0f32, false, false, false, par)
        };
        let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
        let t_gemm = pool.install(|| time(reps, || g(&mut c, par)));
        let c_gemm_n = c.clone();
        g(&mut c, gemm::Parallelism::None);
        let gemm_same = c == c_gemm_n;
        let t_mm = time(reps, || unsafe {
            matrixmultiply::sgemm(m, k, n, 1.0, a.as_ptr(), k as isize, 1, b.as_ptr(), n as isize, 1, 0.0, c.as_mut_ptr(), n as isize, 1)
        });
        let gf = |t: f64| flops / t / 1e9;
        println!("{:<14} {:>16} {:>9.1} {:>9.1} {:>9.1}  {} {}", name, format!("{m}x{k}x{n}"), gf(t_ingot), gf(t_gemm), gf(t_mm), ingot_same, gemm_same);
    }
}
