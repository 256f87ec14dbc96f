//! A model's fused kernels timed alone, on one thread and cut for `THREADS` threads as the CPU
//! runtime cuts them (slices of the domain, [`parts::cut`], else ranges of a compiled
//! program's rows), each piece with its own scratch: where a step's fused-kernel time goes.
//!
//!     fused_probe KERNELS.json [THREADS] [REPS] [MIN_PIECE | work]
//!
//! `KERNELS.json` is what `cargo run --release -p ingot-ir-tests --example cpu_fused_probe --
//! MODEL --dump FILE` writes (each distinct kernel of the model's CPU step and its launches).
//! Rows are sorted by the time a step spends in the kernel at `THREADS` threads; the last line
//! sums each column. `MIN_PIECE` (default 16,384) is the fewest domain elements a piece;
//! `work` takes the runtime's rule since session 44 (16,384 for a body of up to 12
//! instructions, as much fewer as the body is longer, at least 2,048).

use ingot_kernels::fused::cpu::{self, Compiled};
use ingot_kernels::fused::{parts, FusedKernel};
use ingot_kernels::DType;
use rayon::prelude::*;
use std::hint::black_box;
use std::time::Instant;

/// One piece as the runtime runs it: a kernel, where its outputs are, its program, its rows.
struct Piece {
    kernel: FusedKernel,
    outs: Vec<usize>,
    compiled: Option<Compiled>,
    rows: Option<std::ops::Range<usize>>,
}

/// The arena: inputs, outputs, then one scratch slot per piece.
struct Arena {
    mem: Vec<u8>,
    ins: Vec<usize>,
    outs: Vec<usize>,
    scratch: usize,
    slot: usize,
}

fn arena(k: &FusedKernel, slot: usize, slots: usize) -> Arena {
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
    let slot = round(slot);
    let mut mem = vec![0u8; at + slot * slots.max(1) + 256];
    let mut s = 12345u32;
    for (n, inp) in k.inputs.iter().enumerate() {
        let sz = inp.dtype.size();
        for (i, e) in mem[ins[n]..ins[n] + inp.len * sz]
            .chunks_exact_mut(sz)
            .enumerate()
        {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223 ^ i as u32);
            match inp.dtype {
                DType::F32 => {
                    let v = (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0;
                    e.copy_from_slice(&v.to_ne_bytes());
                }
                DType::Bool => e[0] = (s >> 31) as u8,
                _ => {}
            }
        }
    }
    Arena {
        mem,
        ins,
        outs,
        scratch: at,
        slot,
    }
}

/// Median of `reps` runs of `f`, in ms.
fn median(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[t.len() / 2]
}

fn run_one(c: &Option<Compiled>, k: &FusedKernel, mem: &mut [u8], a: (&[usize], &[usize], usize)) {
    let (ins, outs, scratch) = a;
    match c {
        Some(c) => c.run(k, mem, ins, outs, scratch).unwrap(),
        None => cpu::run(k, mem, ins, outs, scratch).unwrap(),
    }
}

/// The runtime's pieces of `k` for `threads` (runtime/src/cpu/planned.rs, `pieces_of`).
fn pieces(k: &FusedKernel, outs: &[usize], threads: usize, min: usize) -> Option<Vec<Piece>> {
    if let Some(ps) = parts::cut(k, threads, min) {
        return Some(
            ps.into_iter()
                .map(|p| Piece {
                    outs: outs
                        .iter()
                        .zip(&p.output_start)
                        .enumerate()
                        .map(|(j, (&at, &start))| at + start * k.output_dtype(j).size())
                        .collect(),
                    compiled: Compiled::new(&p.kernel),
                    kernel: p.kernel,
                    rows: None,
                })
                .collect(),
        );
    }
    let c = Compiled::new(k)?;
    let ranges = c.row_ranges(k, threads, min)?;
    Some(
        ranges
            .into_iter()
            .map(|r| Piece {
                kernel: k.clone(),
                outs: outs.to_vec(),
                compiled: Some(c.clone()),
                rows: Some(r),
            })
            .collect(),
    )
}

struct Base(*mut u8);
// SAFETY: the pieces write disjoint bytes (their outputs' ranges, their own scratch slots).
unsafe impl Sync for Base {}
// SAFETY: as for `Sync`: the pointer is only dereferenced by the pieces, which write disjoint
// bytes while the arena outlives them.
unsafe impl Send for Base {}

/// (ms a launch on one thread, ms a launch at `threads`, pieces, the one-thread output bits
/// equal the threaded ones).
fn time(k: &FusedKernel, threads: usize, reps: usize, min: usize) -> (f64, f64, usize, bool) {
    let whole = Compiled::new(k);
    let mut a1 = arena(k, cpu::scratch_bytes(k), 1);
    let t1 = median(reps, || {
        let a = (&a1.ins[..], &a1.outs[..], a1.scratch);
        run_one(&whole, k, black_box(&mut a1.mem), (a.0, a.1, a.2))
    });
    let ps = pieces(k, &a1.outs, threads, min);
    let need = ps.as_ref().map_or(0, |ps| {
        ps.iter()
            .map(|p| cpu::scratch_bytes(&p.kernel))
            .max()
            .unwrap_or(0)
    });
    let Some(ps) = ps else {
        return (t1, t1, 1, true);
    };
    let mut a = arena(k, need, ps.len());
    let len = a.mem.len();
    let (ins, scratch, slot) = (a.ins.clone(), a.scratch, a.slot);
    let base = Base(a.mem.as_mut_ptr());
    let base = &base;
    let tn = median(reps, || {
        ps.par_iter().enumerate().for_each(|(i, p)| {
            // SAFETY: see `Base`.
            let mem = unsafe { std::slice::from_raw_parts_mut(base.0, len) };
            let s = scratch + i * slot;
            match (&p.compiled, &p.rows) {
                (Some(c), Some(r)) => c
                    .run_rows(&p.kernel, mem, &ins, &p.outs, s, r.clone())
                    .unwrap(),
                (c, _) => run_one(c, &p.kernel, mem, (&ins, &p.outs, s)),
            }
        })
    });
    let out_bytes = |m: &[u8], outs: &[usize]| -> Vec<u8> {
        (0..k.outputs.len())
            .flat_map(|j| {
                let n = k.output_len(j) * k.output_dtype(j).size();
                m[outs[j]..outs[j] + n].to_vec()
            })
            .collect()
    };
    let same = out_bytes(&a1.mem, &a1.outs) == out_bytes(&a.mem, &a.outs);
    (t1, tn, ps.len(), same)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .expect("usage: fused_probe KERNELS.json [THREADS] [REPS] [MIN]");
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    let reps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(9);
    let by_work = args.get(3).is_some_and(|s| s == "work");
    let min: usize = args
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(16 * 1024);
    // The runtime's `min_piece` (runtime/src/cpu/planned.rs).
    let min_of = |k: &FusedKernel| match by_work {
        true => (min * 12 / k.body.len().max(12)).max(min / 8),
        false => min,
    };
    let text = std::fs::read_to_string(path).expect("the kernels' file");
    let kernels: Vec<(FusedKernel, usize)> = serde_json::from_str(&text).expect("kernels JSON");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a pool");
    let mut rows = Vec::new();
    let (mut s1, mut sn) = (0f64, 0f64);
    let mut differ = 0;
    for (k, n) in &kernels {
        let numel: usize = k.domain.iter().product();
        let how = match Compiled::new(k) {
            Some(c) if c.is_columns() => format!("columns {:?}", c.shape()),
            Some(c) => format!("rows {:?}", c.shape()),
            None => "interpreted".to_string(),
        };
        let (t1, tn, pcs, same) = pool.install(|| time(k, threads, reps, min_of(k)));
        s1 += t1 * *n as f64;
        sn += tn * *n as f64;
        differ += usize::from(!same);
        rows.push((
            tn * *n as f64,
            format!(
                "{:8.3} {:8.3} {:3} {:8.3} {:8.3} {:7.2} {:3}{}  {:?} r{:?} in {} body {} out {} {how}",
                tn * *n as f64,
                t1 * *n as f64,
                n,
                t1,
                tn,
                t1 * 1e6 / numel.max(1) as f64,
                pcs,
                if same { "" } else { " DIFFER" },
                k.domain,
                k.reduce_axes,
                k.inputs.len(),
                k.body.len(),
                k.outputs.len(),
            ),
        ));
    }
    rows.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
    let rule = if by_work {
        " (fewer for long bodies)"
    } else {
        ""
    };
    println!(
        "{path}: {threads} threads, medians of {reps}, pieces of at least {min} elements{rule}"
    );
    println!(" ms/step ms/step1   n  ms/1thr  ms/thrs ns/elem1 pcs  kernel");
    for (_, r) in &rows {
        println!("{r}");
    }
    println!(
        "total {sn:.3} ms a step at {threads} threads, {s1:.3} on one; {} kernels, {differ} differ across thread counts",
        rows.len()
    );
}
