//! How fast `fused::cpu::run` is against hand-written Rust loops for the same math, single
//! threaded: softmax over [4096, 1024], layer norm forward over [8192, 768], a 5-op elementwise
//! chain over 8M elements, and a column sum [8192, 768] -> [1, 768], all f32.
//!
//! Run with `cargo run --release -p ingot-kernels --example fused_speed`. Prints the best of a
//! few runs of each and the ratio fused / hand-written (lower is better, 1.0 is parity).

use ingot_kernels::fused::{cpu, FusedKernel, Inst, Output};
use ingot_kernels::{BinaryOp, ReduceOp};
use ingot_testkit::fused_kernels::{bin, f32_const, layer_norm, softmax_rows, strided_input};
use std::hint::black_box;
use std::time::Instant;

/// `((x·2 + 1) max 0)·x − 0.5`
fn chain(n: usize) -> FusedKernel {
    FusedKernel {
        domain: vec![n],
        reduce_axes: vec![],
        inputs: vec![strided_input(&[n], &[1])],
        body: vec![
            Inst::Load { input: 0 },
            f32_const(2.0),
            bin(BinaryOp::Mul, 0, 1),
            f32_const(1.0),
            bin(BinaryOp::Add, 2, 3),
            f32_const(0.0),
            bin(BinaryOp::Max, 4, 5),
            bin(BinaryOp::Mul, 6, 0),
            f32_const(0.5),
            bin(BinaryOp::Sub, 7, 8),
        ],
        outputs: vec![Output { value: 9 }],
    }
}

fn column_sum(r: usize, n: usize) -> FusedKernel {
    FusedKernel {
        domain: vec![r, n],
        reduce_axes: vec![0],
        inputs: vec![strided_input(&[r, n], &[n, 1])],
        body: vec![
            Inst::Load { input: 0 },
            Inst::Reduce {
                op: ReduceOp::Sum,
                x: 0,
            },
        ],
        outputs: vec![Output { value: 1 }],
    }
}

fn hand_softmax(x: &[f32], y: &mut [f32], n: usize) {
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let m = xr.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let mut s = 0.0;
        for (o, &v) in yr.iter_mut().zip(xr) {
            *o = (v - m).exp();
            s += *o;
        }
        for o in yr.iter_mut() {
            *o /= s;
        }
    }
}

fn hand_layer_norm(x: &[f32], g: &[f32], b: &[f32], y: &mut [f32], n: usize) {
    let nf = n as f32;
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let mean = xr.iter().sum::<f32>() / nf;
        let var = xr.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / nf;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        for j in 0..n {
            yr[j] = (xr[j] - mean) * rstd * g[j] + b[j];
        }
    }
}

fn hand_chain(x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = (v * 2.0 + 1.0).max(0.0) * v - 0.5;
    }
}

fn hand_column_sum(x: &[f32], y: &mut [f32], n: usize) {
    y.fill(0.0);
    for row in x.chunks_exact(n) {
        for (o, &v) in y.iter_mut().zip(row) {
            *o += v;
        }
    }
}

/// Best wall time of `reps` calls, in milliseconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// Times the fused kernel (inputs filled with `data`) in a planned arena.
fn time_fused(k: &FusedKernel, data: &[Vec<f32>], reps: usize) -> f64 {
    k.check().unwrap();
    let round = |x: usize| x.div_ceil(256) * 256;
    let mut at = 0;
    let mut ins = vec![];
    for inp in &k.inputs {
        ins.push(at);
        at = round(at + inp.len * 4);
    }
    let mut outs = vec![];
    for j in 0..k.outputs.len() {
        outs.push(at);
        at = round(at + k.output_len(j) * 4);
    }
    let scratch = at;
    let mut mem = vec![0u8; scratch + cpu::scratch_bytes(k)];
    for (&o, d) in ins.iter().zip(data) {
        for (i, v) in d.iter().enumerate() {
            mem[o + 4 * i..o + 4 * i + 4].copy_from_slice(&v.to_ne_bytes());
        }
    }
    best(reps, || {
        cpu::run(k, black_box(&mut mem), &ins, &outs, scratch).unwrap();
    })
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

fn report(name: &str, fused: f64, hand: f64, elems: usize) {
    println!(
        "{name:<34} fused {fused:8.2} ms  hand-written {hand:8.2} ms  ratio {:5.2}  ({:.2} ns/elem fused)",
        fused / hand,
        fused * 1e6 / elems as f64
    );
}

fn main() {
    // Optional arguments: a word that selects benchmarks (softmax, layer, chain, column), and
    // the number of timed runs (default 7; the best counts).
    let args: Vec<String> = std::env::args().skip(1).collect();
    let only = |name: &str| {
        args.first()
            .is_none_or(|a| a == "all" || name.contains(a.as_str()))
    };
    let reps: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(7);

    if only("softmax") {
        let (r, n) = (4096, 1024);
        let x = data(r * n, 1);
        let mut y = vec![0f32; r * n];
        let f = time_fused(&softmax_rows(r, n), std::slice::from_ref(&x), reps);
        let h = best(reps, || hand_softmax(black_box(&x), black_box(&mut y), n));
        report("softmax [4096, 1024]", f, h, r * n);
    }
    if only("layer") {
        let (r, n) = (8192, 768);
        let x = data(r * n, 2);
        let (g, b) = (data(n, 3), data(n, 4));
        let mut y = vec![0f32; r * n];
        let f = time_fused(
            &layer_norm(r, n, true, false),
            &[x.clone(), g.clone(), b.clone()],
            reps,
        );
        let h = best(reps, || {
            hand_layer_norm(black_box(&x), &g, &b, black_box(&mut y), n)
        });
        report("layer norm forward [8192, 768]", f, h, r * n);
    }
    if only("chain") {
        let n = 8 << 20;
        let x = data(n, 5);
        let mut y = vec![0f32; n];
        let f = time_fused(&chain(n), std::slice::from_ref(&x), reps);
        let h = best(reps, || hand_chain(black_box(&x), black_box(&mut y)));
        report("elementwise 5-op chain [8M]", f, h, n);
    }
    if only("column") {
        let (r, n) = (8192, 768);
        let x = data(r * n, 6);
        let mut y = vec![0f32; n];
        let f = time_fused(&column_sum(r, n), std::slice::from_ref(&x), reps);
        let h = best(reps, || {
            hand_column_sum(black_box(&x), black_box(&mut y), n)
        });
        report("column sum [8192, 768] -> [1, 768]", f, h, r * n);
    }
}
