//! Where a GPU step's time goes: runs the step's operations one at a time with an event after
//! each (outside the CUDA graph), and prints the device time by kind and the costliest
//! operations, grouped by what they compute, with the bytes each must read and write (its
//! planned locations, each once: `Touch::bytes`) and the rate that achieves. First, the step's graph is replayed as captured
//! (the dependency graph) and as a serial chain, alternately, to measure what overlapping
//! independent operations gains.
//!
//!     cuda_profile MODEL [--tf32 | --precision f32|tf32|bf16] [--chunk-loss-head] [--top N]
//!                  [--gpus N [--reduce-in-bf16]] [--no-weight-copies] [--timeline [--csv PATH]]
//!
//! With `--gpus N` the step is compiled for N data-parallel ranks and loaded on N GPUs; the
//! op-by-op times are rank 0's, every rank running its operations one at a time together (so
//! an all-reduce's time includes waiting for the other ranks to reach it).
//!
//! With `--timeline [--csv PATH]` it instead replays the step as a graph with a timestamp after
//! each operation (`ingot_runtime::cuda::timeline`), all ranks at once, and prints for each rank
//! the collectives' spans, the part of their time no other operation overlapped, and the
//! operations that end last; `--csv` writes every operation's span.
//!
//! MODEL may also be a step executable written by `ingot compile --device cuda` (a path that
//! names a file), its precision and options as
//! compiled (`--tf32`, `--precision` and the step flags then do not apply).
//!
//! Needs a GPU; without one it says so and exits 0.

use ingot_compiler::ir::{Graph, Op};
use ingot_compiler::lower::cuda::{DeviceOp, Program};
use ingot_compiler::lower::{CopyIn, CopyOut};
use ingot_models::by_name;
use ingot_runtime::cuda::{self, timeline, CudaOptions};
use ingot_trainer::session::{Device, Session};
use std::collections::BTreeMap;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().cloned().unwrap_or_else(|| "gpt-mini".into());
    let tf32 = args.iter().any(|a| a == "--tf32");
    let top: usize = args
        .iter()
        .position(|a| a == "--top")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(25);
    if let Err(e) = cuda::available() {
        println!("skipping: {e}");
        return;
    }
    let compiled = std::path::Path::new(&model)
        .is_file()
        .then(|| ingot_compiler::exe::Executable::read(&model).expect("a step executable"));
    let m = match compiled {
        Some(_) => by_name("mlp").expect("mlp"),
        None => by_name(&model).expect("a model name"),
    };
    let device = |serial| {
        Device::Cuda(CudaOptions {
            serial,
            ..CudaOptions::default()
        })
    };
    let mut opts = device(false).options();
    if tf32 {
        opts.precision = Some(ingot_compiler::precision::Precision::Tf32);
    }
    if args.iter().any(|a| a == "--no-fuse-attention") {
        opts.fuse_attention = false;
    }
    if let Some(p) = args
        .iter()
        .position(|a| a == "--precision")
        .and_then(|i| args.get(i + 1))
    {
        opts.precision = Some(
            ingot_compiler::precision::Precision::from_name(p)
                .expect("--precision f32, tf32 or bf16"),
        );
    }
    let step = ingot_compiler::autodiff::StepOptions {
        loss_head_chunk_bytes: if args.iter().any(|a| a == "--chunk-loss-head") {
            ingot_compiler::autodiff::chunk::HEAD_CHUNK_BYTES
        } else {
            0
        },
        ranks: args
            .iter()
            .position(|a| a == "--gpus")
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse().expect("--gpus N"))
            .unwrap_or(0),
        reduce_in_bf16: args.iter().any(|a| a == "--reduce-in-bf16"),
        cast_weights_each_step: args.iter().any(|a| a == "--no-weight-copies"),
        ..Default::default()
    };
    let session = |opts: &ingot_compiler::pipeline::Options, device: Device| {
        if let Some(exe) = &compiled {
            return Session::from_executable(exe.clone(), 0, device).expect("a session");
        }
        let exe = ingot_compiler::pipeline::compile_observed_with(&m, &step, opts, &mut |_| {})
            .expect("the step compiles")
            .executable(device.target())
            .expect("the step lowers");
        Session::from_executable(exe, 0, device).expect("a session")
    };
    if args.iter().any(|a| a == "--timeline") {
        let csv = args
            .iter()
            .position(|a| a == "--csv")
            .and_then(|i| args.get(i + 1));
        let mut s = session(&opts, device(false));
        for _ in 0..3 {
            s.step().expect("a step");
        }
        let stamps = s
            .timeline_gpu(5)
            .expect("a GPU session")
            .expect("the timeline");
        print_timeline(&model, &s, &stamps, top, csv.map(String::as_str));
        return;
    }
    // Graph replays, dependency graph and serial chain in alternating rounds of 5 (one session
    // at a time, so that the largest models fit): the medians of 3 rounds' medians.
    let mut rounds: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (serial, out) in [false, true].into_iter().zip(rounds.iter_mut()) {
            let mut s = session(&opts, device(serial));
            s.step().unwrap();
            let mut ms: Vec<f64> = (0..5).map(|_| s.step().unwrap().seconds * 1e3).collect();
            ms.sort_by(f64::total_cmp);
            out.push(ms[2]);
        }
    }
    for r in &mut rounds {
        r.sort_by(f64::total_cmp);
    }
    let graph_ms = [rounds[0][1], rounds[1][1]];
    let mut s = session(&opts, device(false));
    // Op-by-op runs: the median of three per op.
    let mut runs: Vec<Vec<f32>> = Vec::new();
    for _ in 0..3 {
        runs.push(s.profile_gpu().expect("a GPU session").expect("profile"));
    }
    let c = s.cuda().unwrap();
    let g = s.graph();
    let program = c.program();
    let times: Vec<f64> = (0..program.ops.len())
        .map(|i| {
            let mut v: Vec<f32> = runs.iter().map(|r| r[i]).collect();
            v.sort_by(f32::total_cmp);
            v[1] as f64
        })
        .collect();
    let mut by_kind: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    let mut by_what: BTreeMap<String, (f64, usize, usize)> = BTreeMap::new();
    for ((op, &t), touch) in program.ops.iter().zip(&times).zip(&program.touches) {
        let (kind, what) = describe(op, g, program);
        let e = by_kind.entry(kind).or_default();
        e.0 += t;
        e.1 += 1;
        let e = by_what.entry(what).or_default();
        e.0 += t;
        e.1 += 1;
        e.2 += touch.bytes();
    }
    let total: f64 = times.iter().sum();
    let edges: usize = program.deps.iter().map(|d| d.len()).sum();
    println!(
        "{model} ({}): graph replay {:.3} ms as a dependency graph ({} edges), {:.3} ms as a \
         serial chain ({:.3}x); op by op {:.3} ms over {} ops",
        compiled
            .as_ref()
            .map_or(opts.precision.unwrap_or_default(), |e| e.precision()),
        graph_ms[0],
        edges,
        graph_ms[1],
        graph_ms[1] / graph_ms[0],
        total,
        times.len()
    );
    for (k, (t, n)) in &by_kind {
        println!(
            "  {k:<14} {t:>9.3} ms  {n:>5} ops  {:>5.1}%",
            100.0 * t / total
        );
    }
    let mut rows: Vec<(String, f64, usize, usize)> = by_what
        .into_iter()
        .map(|(w, (t, n, b))| (w, t, n, b))
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("costliest (bytes: what each op must read and write, each buffer once):");
    for (w, t, n, bytes) in rows.iter().take(top) {
        println!(
            "  {t:>9.3} ms  x{n:<4} {:>8.1} us each {:>9.1} MB each {:>7.0} GB/s  {w}",
            1e3 * t / *n as f64,
            *bytes as f64 / *n as f64 / 1e6,
            *bytes as f64 / (t * 1e-3) / 1e9
        );
    }
}

/// What kind of operation `op` is, and what it computes (with its launch shape).
fn describe(op: &DeviceOp, g: &Graph, program: &Program) -> (&'static str, String) {
    match op {
        DeviceOp::AllReduce { bytes, dtype, .. } => (
            "all-reduce",
            format!("all-reduce {bytes} bytes of {dtype:?}"),
        ),
        DeviceOp::AllGather { bytes, ranks, .. } => (
            "all-gather",
            format!("all-gather {bytes} bytes from each of {ranks} ranks"),
        ),
        DeviceOp::ReduceScatter {
            parts,
            dtype,
            ranks,
            ..
        } => (
            "reduce-scatter",
            format!(
                "reduce-scatter {} bytes of {dtype:?} in {} parts over {ranks} ranks",
                parts.iter().map(|p| p.bytes * ranks).sum::<usize>(),
                parts.len()
            ),
        ),
        DeviceOp::Gemm(gm) => (
            "gemm",
            format!(
                "gemm m={} n={} k={} batch={} t1={} t2={}",
                gm.m, gm.n, gm.k, gm.batch, gm.trans_first, gm.trans_second
            ),
        ),
        DeviceOp::Conv(c) => (
            "convolution",
            format!(
                "conv {} {:?} {:?} groups={} (or {} fallback ops)",
                c.pass.name(),
                c.dtype,
                c.dims,
                c.dims.groups,
                c.fallback.len()
            ),
        ),
        DeviceOp::Launch { node, kernel, .. } => {
            let n = g.node(*node);
            let desc = match &n.op {
                Op::Fused(k) => format!(
                    "fused {:?} reduce {:?} in {} out {}",
                    k.domain,
                    k.reduce_axes,
                    k.inputs.len(),
                    k.outputs.len()
                ),
                op => format!("{} {}", op.name(), n.ty),
            };
            let l = program.kernels[*kernel].launch;
            (
                if matches!(n.op, Op::Fused(_)) {
                    "fused"
                } else {
                    "other kernels"
                },
                format!("{desc} grid {:?} block {:?}", l.grid, l.block),
            )
        }
        DeviceOp::Zero { bytes, .. } => ("memset", format!("memset {bytes} B")),
        DeviceOp::Copy { bytes, .. } => ("copy", format!("copy {bytes} B")),
        DeviceOp::CopyIn(CopyIn { leaf, bytes, .. }) => {
            ("offload", format!("copy in {leaf} {bytes} B"))
        }
        DeviceOp::CopyOut(CopyOut { leaf, bytes, .. }) => {
            ("offload", format!("copy out {leaf} {bytes} B"))
        }
    }
}

/// Prints each rank's timeline: the step's length in the graph with stamps, the collectives'
/// time that no other operation overlapped, every collective's span, and the `top` operations
/// that end last (the step's tail); with `csv`, every operation's span per rank into that file.
fn print_timeline(model: &str, s: &Session, stamps: &[Vec<u64>], top: usize, csv: Option<&str>) {
    let c = s.cuda().expect("a GPU session");
    let g = s.graph();
    let program = c.program();
    let collective: Vec<bool> = program.ops.iter().map(DeviceOp::is_collective).collect();
    let mut rows = String::from("rank,op,kind,start_us,end_us,what,origin\n");
    for (r, st) in stamps.iter().enumerate() {
        let spans = timeline::spans(st, &program.deps);
        let length = timeline::length_us(&spans);
        let exposed = timeline::exposed_collective_us(&spans, &collective);
        let busy: f64 = spans
            .iter()
            .zip(&collective)
            .filter(|(_, &c)| c)
            .map(|(sp, _)| sp.us())
            .sum();
        println!(
            "{model} rank {r} of {}: {:.1} us with stamps; collectives {:.1} us, {:.1} us of it \
             with no other operation running",
            stamps.len(),
            length,
            busy,
            exposed
        );
        let label = |i: usize| {
            let (kind, what) = describe(&program.ops[i], g, program);
            let origin = program.ops[i]
                .node()
                .map(|n| g.origin(n).to_string())
                .unwrap_or_default();
            (kind, what, origin)
        };
        for (i, sp) in spans.iter().enumerate().filter(|(i, _)| collective[*i]) {
            let (_, what, origin) = label(i);
            println!(
                "  collective op {i:>4}: {:>9.1} .. {:>9.1} us ({:>7.1} us)  {what}  [{origin}]",
                sp.start_us,
                sp.end_us,
                sp.us()
            );
        }
        let mut order: Vec<usize> = (0..spans.len()).collect();
        order.sort_by(|&a, &b| spans[a].end_us.total_cmp(&spans[b].end_us));
        println!("  the {top} operations that end last:");
        let tail = order.len().saturating_sub(top);
        for &i in &order[tail..] {
            let (_, what, origin) = label(i);
            let sp = spans[i];
            println!(
                "    op {i:>4}: {:>9.1} .. {:>9.1} us ({:>7.1} us)  {what}  [{origin}]",
                sp.start_us,
                sp.end_us,
                sp.us()
            );
        }
        for (i, sp) in spans.iter().enumerate() {
            let (kind, what, origin) = label(i);
            rows += &format!(
                "{r},{i},{kind},{:.2},{:.2},\"{what}\",\"{origin}\"\n",
                sp.start_us, sp.end_us
            );
        }
    }
    if let Some(path) = csv {
        std::fs::write(path, rows).expect("writing the timeline's CSV");
    }
}
