//! Achieved GFLOP/s of the CPU convolutions on N threads, beside the GEMM on its own: for
//! each of resnet18's 3x3 convolutions (CIFAR shape, batch 128) and each pass, the pass
//! through `cpu::conv` in its most workspace (`workspace_len_up_to`, what the planner grants
//! where the slab has room), and the one GEMM over the batch the pass amounts to (its operands
//! made beforehand: no im2col, no copies), then a large square product. What the pass loses
//! against its bare GEMM is im2col / col2im, the copies and the cut into lanes and blocks; what
//! the bare GEMM loses against the square one is its shape.
//!
//! ```text
//! cargo run --release -p ingot-kernels --example conv_speed -- [THREADS]
//! ```
//!
//! THREADS defaults to every core; the kernels run inside a rayon pool of that many threads,
//! as the CPU executor runs a step. Each figure is the median of 9 timed runs after a warm-up.
//!
//! A second table splits each input gradient: its GEMMs alone as session 42's pass ran them
//! (blocks of 1,024 columns, `C = Wᵀ · dy[block]`, one after another, each spread over the
//! threads) and as the tiles run them (72 rows of `Wᵀ` by 256 columns, the units shared by 16
//! lanes, each lane's products on one thread alone), and the side-by-side copy of `dy`; what
//! the pass takes beyond its GEMMs is its col2im and copies.

use ingot_kernels::cpu::conv::{self, ConvGeometry, Pass};
use ingot_kernels::cpu::gemm::gemm_ws_alone;
use ingot_kernels::cpu::{gemm_ws, workspace_len, MatLayout};
use rayon::prelude::*;
use std::time::Instant;

/// Median milliseconds of `runs` calls of `f`, after one warm-up call.
fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[runs / 2]
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + seed * 3) % 13) as f32 * 0.1 - 0.6)
        .collect()
}

/// Milliseconds of one `m × k × n` product, row-major operands, in its own workspace.
fn gemm_ms(m: usize, k: usize, n: usize) -> f64 {
    let (a, b) = (values(m * k, 1), values(k * n, 2));
    let mut c = vec![0f32; m * n];
    let mut ws = vec![0f32; workspace_len::<f32>(m, k, n)];
    let rm = MatLayout::row_major;
    median_ms(9, || {
        gemm_ws(
            m,
            k,
            n,
            1.0,
            &a,
            rm(k),
            &b,
            rm(n),
            0.0,
            &mut c,
            rm(n),
            &mut ws,
        )
        .unwrap()
    })
}

/// Milliseconds of `pass` of `g` through `cpu::conv`, in its most workspace.
fn pass_ms(g: &ConvGeometry, pass: Pass) -> f64 {
    let x_len = g.batch * g.in_ch * g.in_hw[0] * g.in_hw[1];
    let (y_len, w_len) = (g.batch * g.out_ch * g.positions(), g.out_ch * g.col_rows());
    let (x, w, dy) = (values(x_len, 3), values(w_len, 4), values(y_len, 5));
    let mut ws = vec![0f32; conv::workspace_len_up_to::<f32>(g, pass)];
    let (mut y, mut dx, mut dw) = (vec![0f32; y_len], vec![0f32; x_len], vec![0f32; w_len]);
    median_ms(9, || match pass {
        Pass::Forward => conv::forward(g, &x, &w, &mut y, &mut ws).unwrap(),
        Pass::GradInput => conv::grad_input(g, &dy, &w, &mut dx, &mut ws).unwrap(),
        Pass::GradWeight => conv::grad_weight(g, &x, &dy, &mut dw, &mut ws).unwrap(),
    })
}

/// The input gradient's GEMMs alone, in milliseconds: `(blocks, tiles, copy)`: as blocks of
/// 1,024 columns one after another on the pool's threads, as 16 lanes of tiles of 72 rows and
/// 256 columns each on one thread, and the copy of `dy` side by side.
fn grad_input_parts_ms(g: &ConvGeometry) -> (f64, f64, f64) {
    let (o, k, p, n) = (g.out_ch, g.col_rows(), g.positions(), g.batch);
    let w = values(o * k, 4);
    let cm = MatLayout::col_major(k);
    let rm = MatLayout::row_major;
    let block = (1024 / p).clamp(1, n) * p;
    let dy = values(o * block, 5);
    let mut c = vec![0f32; k * block];
    let mut ws = vec![0f32; workspace_len::<f32>(k, o, block)];
    let blocks = median_ms(9, || {
        for _ in 0..(n * p).div_ceil(block) {
            gemm_ws(
                k,
                o,
                block,
                1.0,
                &w,
                cm,
                &dy,
                rm(block),
                0.0,
                &mut c,
                rm(block),
                &mut ws,
            )
            .unwrap();
        }
    });
    let (rows, cols, lanes) = (72.min(k), 256.min(n * p), 16);
    let units = (n * p).div_ceil(cols) * k.div_ceil(rows);
    let lane_len = rows * cols + workspace_len::<f32>(rows, o, cols);
    let mut lane_ws = vec![0f32; lanes * lane_len];
    let tiles = median_ms(9, || {
        lane_ws
            .par_chunks_mut(lane_len)
            .enumerate()
            .for_each(|(l, lane)| {
                let (c, ws) = lane.split_at_mut(rows * cols);
                for u in (l * units / lanes)..((l + 1) * units / lanes) {
                    let at = (u % k.div_ceil(rows)) * rows;
                    let r = rows.min(k - at);
                    gemm_ws_alone(
                        r,
                        o,
                        cols,
                        1.0,
                        &w,
                        cm.at(at),
                        &dy,
                        rm(cols),
                        0.0,
                        c,
                        rm(cols),
                        ws,
                    )
                    .unwrap();
                }
            })
    });
    let (from, mut to) = (values(n * o * p, 6), vec![0f32; n * o * p]);
    let copy = median_ms(9, || {
        let per = block / p;
        to.par_chunks_mut(o * block)
            .zip(from.par_chunks(o * block))
            .for_each(|(to, from)| {
                for i in 0..from.len() / (o * p) {
                    for r in 0..o {
                        let (a, b) = ((i * o + r) * p, r * per * p + i * p);
                        to[b..b + p].copy_from_slice(&from[a..a + p]);
                    }
                }
            })
    });
    (blocks, tiles, copy)
}

fn main() {
    let threads = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |p| p.get()));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool");
    println!(
        "{threads} threads, gemm kernel {}",
        ingot_kernels::cpu::gemm::kernel_name()
    );
    println!("| convolution | pass | GFLOP | pass ms | pass GFLOP/s | bare GEMM (m x k x n) | GEMM ms | GEMM GFLOP/s |");
    println!("|---|---|---:|---:|---:|---|---:|---:|");
    for (side, ch) in [(8, 64), (4, 128), (2, 256)] {
        let g = ConvGeometry::new(
            [128, ch, side, side],
            [ch, ch, 3, 3],
            [1, 1],
            [1, 1],
            [1, 1],
            1,
        )
        .expect("a geometry");
        let (o, k, cols) = (g.out_ch, g.col_rows(), g.batch * g.positions());
        let flop = 2.0 * (o * k * cols) as f64;
        for (pass, (m, kk, n)) in [
            (Pass::Forward, (o, k, cols)),
            (Pass::GradInput, (k, o, cols)),
            (Pass::GradWeight, (o, cols, k)),
        ] {
            let (pm, gm) = pool.install(|| (pass_ms(&g, pass), gemm_ms(m, kk, n)));
            println!(
                "| {ch}x{side}x{side} | {pass:?} | {:.3} | {pm:.3} | {:.0} | {m}x{kk}x{n} | {gm:.3} | {:.0} |",
                flop / 1e9,
                flop / pm / 1e6,
                flop / gm / 1e6
            );
        }
    }
    for n in [1024, 2048] {
        let ms = pool.install(|| gemm_ms(n, n, n));
        let flop = 2.0 * (n * n * n) as f64;
        println!(
            "| square | {n}^3 | {:.3} | | | {n}x{n}x{n} | {ms:.3} | {:.0} |",
            flop / 1e9,
            flop / ms / 1e6
        );
    }
    println!();
    println!("| input gradient | pass ms | GEMMs in blocks of 1,024 columns, ms (GFLOP/s) | GEMMs in 16 lanes of 72x256 tiles, ms (GFLOP/s) | dy side by side, ms |");
    println!("|---|---:|---:|---:|---:|");
    for (side, ch) in [(8, 64), (4, 128), (2, 256)] {
        let g = ConvGeometry::new(
            [128, ch, side, side],
            [ch, ch, 3, 3],
            [1, 1],
            [1, 1],
            [1, 1],
            1,
        )
        .expect("a geometry");
        let flop = 2.0 * (g.out_ch * g.col_rows() * g.batch * g.positions()) as f64;
        let (pm, (b, t, c)) =
            pool.install(|| (pass_ms(&g, Pass::GradInput), grad_input_parts_ms(&g)));
        println!(
            "| {ch}x{side}x{side} | {pm:.3} | {b:.3} ({:.0}) | {t:.3} ({:.0}) | {c:.3} |",
            flop / b / 1e6,
            flop / t / 1e6
        );
    }
}
