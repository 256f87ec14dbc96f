//! Each distinct fused kernel of a model's CPU step, timed alone on one thread: how the CPU
//! executor runs it (a compiled program, rows or columns, its lanes and rows a group; or the
//! interpreter), how the runtime would cut it for `THREADS` threads, and its time a launch,
//! whole and as the sum of its pieces run one after another (the work the threads share).
//!
//!     cpu_fused_probe MODEL [THREADS] [REPS]     e.g. cpu_fused_probe resnet18 16
//!     cpu_fused_probe MODEL --dump FILE          the distinct kernels and their launches as
//!                                                JSON, for `ingot-kernels`' `fused_probe`
//!
//! Rows are sorted by time a step (launches x time a launch), largest first; the last line
//! sums them. For finding which fused kernels are slow for their bytes, and why.

use ingot_compiler::ir::Op;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline;
use ingot_kernels::fused::cpu::{self, Compiled};
use ingot_kernels::fused::{parts, FusedKernel};
use ingot_kernels::DType;
use std::hint::black_box;
use std::time::Instant;

/// The runtime's `MIN_PIECE` (runtime/src/cpu/planned.rs).
const MIN_PIECE: usize = 16 * 1024;

struct Arena {
    mem: Vec<u8>,
    ins: Vec<usize>,
    outs: Vec<usize>,
    scratch: usize,
}

fn arena(k: &FusedKernel, scratch_bytes: usize) -> Arena {
    let round = |x: usize| x.div_ceil(256) * 256;
    let mut at = 0;
    let mut ins = vec![];
    for inp in &k.inputs {
        ins.push(at);
        at = round(at + inp.len * inp.dtype.size());
    }
    let mut outs = vec![];
    for j in 0..k.outputs.len() {
        outs.push(at);
        at = round(at + k.output_len(j) * k.output_dtype(j).size());
    }
    let scratch = at;
    let mut mem = vec![0u8; scratch + scratch_bytes + 256];
    let mut s = 12345u32;
    for (n, inp) in k.inputs.iter().enumerate() {
        for i in 0..inp.len {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            let o = ins[n] + i * inp.dtype.size();
            match inp.dtype {
                DType::F32 => {
                    let v = (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0;
                    mem[o..o + 4].copy_from_slice(&v.to_ne_bytes());
                }
                DType::Bool => mem[o] = (s >> 31) as u8,
                _ => {}
            }
        }
    }
    Arena {
        mem,
        ins,
        outs,
        scratch,
    }
}

/// Best of `reps` runs of `f`, in ms.
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

fn time_whole(k: &FusedKernel, reps: usize) -> f64 {
    let c = Compiled::new(k);
    let mut a = arena(k, cpu::scratch_bytes(k));
    best(reps, || match &c {
        Some(c) => c
            .run(k, black_box(&mut a.mem), &a.ins, &a.outs, a.scratch)
            .unwrap(),
        None => cpu::run(k, black_box(&mut a.mem), &a.ins, &a.outs, a.scratch).unwrap(),
    })
}

/// The pieces the runtime would make for `threads`, run one after another: (pieces, ms).
fn time_pieces(k: &FusedKernel, threads: usize, reps: usize) -> (usize, f64) {
    if let Some(ps) = parts::cut(k, threads, MIN_PIECE) {
        let t: f64 = ps.iter().map(|p| time_whole(&p.kernel, reps)).sum();
        return (ps.len(), t);
    }
    let Some(c) = Compiled::new(k) else {
        return (1, f64::NAN);
    };
    let Some(ranges) = c.row_ranges(k, threads, MIN_PIECE) else {
        return (1, f64::NAN);
    };
    let mut a = arena(k, cpu::scratch_bytes(k));
    let t = ranges
        .iter()
        .map(|r| {
            best(reps, || {
                c.run_rows(
                    k,
                    black_box(&mut a.mem),
                    &a.ins,
                    &a.outs,
                    a.scratch,
                    r.clone(),
                )
                .unwrap()
            })
        })
        .sum();
    (ranges.len(), t)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().cloned().unwrap_or_else(|| "resnet18".into());
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let opts = pipeline::Options::for_target(Target::Cpu);
    let c = ingot_models::compile_model(&model, &opts).expect("the step compiles");
    let g = &c.graph;
    let mut kernels: Vec<(FusedKernel, usize)> = Vec::new();
    for id in g.ids() {
        if let Op::Fused(k) = &g.node(id).op {
            match kernels.iter_mut().find(|(q, _)| *q == **k) {
                Some((_, n)) => *n += 1,
                None => kernels.push(((**k).clone(), 1)),
            }
        }
    }
    if args.get(1).map(String::as_str) == Some("--dump") {
        let path = args.get(2).expect("--dump FILE");
        let text = serde_json::to_string(&kernels).expect("kernels serialize");
        std::fs::write(path, text).expect("the dump is written");
        println!("{} distinct kernels written to {path}", kernels.len());
        return;
    }
    let mut rows = Vec::new();
    for (k, n) in &kernels {
        let numel: usize = k.domain.iter().product();
        let how = match Compiled::new(k) {
            Some(c) if c.is_columns() => format!("columns {:?}", c.shape()),
            Some(c) => format!("rows {:?}", c.shape()),
            None => "interpreted".to_string(),
        };
        let whole = time_whole(k, reps);
        let (pieces, pt) = time_pieces(k, threads, reps);
        let ins: Vec<String> = k
            .inputs
            .iter()
            .map(|i| format!("{:?}", i.access.strides))
            .collect();
        rows.push((
            whole * *n as f64,
            format!(
                "{:8.3} {:3} {:8.3} {:6.1} {:3} {:8.3}  {:?} r{:?} body {} in {} out {} {how}",
                whole * *n as f64,
                n,
                whole,
                whole * 1e6 / numel as f64,
                pieces,
                pt,
                k.domain,
                k.reduce_axes,
                k.body.len(),
                ins.join(" "),
                k.outputs.len(),
            ),
        ));
    }
    rows.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
    println!("model {model}, one thread, best of {reps}; pieces as cut for {threads} threads");
    println!("ms/step  n  ms/launch ns/elem pcs pieces_ms  kernel");
    for (_, r) in &rows {
        println!("{r}");
    }
    let total: f64 = rows.iter().map(|r| r.0).sum();
    println!(
        "total {total:.3} ms a step in {} distinct kernels",
        rows.len()
    );
}
