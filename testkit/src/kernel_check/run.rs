//! The device: compiling the work items into one module, running and timing each.

use super::data::inputs_for;
use super::reference::{compare, reference, tolerances, Tolerance};
use super::work::{Item, Res, Work};
use crate::device::{self, alloc, driver, launch, sync};
use cudarc::driver::{result, sys};
use ingot_kernels::cuda::{self, CudaKernel, FusedArg, FusedProgram, PRELUDE, PRELUDE_BF16};
use ingot_kernels::fused::FusedKernel;
use std::collections::HashMap;
use std::time::Instant;

pub(super) struct Loaded {
    pub(super) module: sys::CUmodule,
    pub(super) functions: HashMap<String, device::Function>,
}

pub(super) fn compile(
    items: &[Item],
    arch: &'static str,
    log: &mut dyn FnMut(&str),
) -> Res<Loaded> {
    // Every helper, bf16's included (unused ones cost nothing).
    let mut src = format!("{PRELUDE}{PRELUDE_BF16}");
    let mut seen = HashMap::new();
    for it in items {
        let launches = it.program.launches.iter().map(|l| &l.kernel);
        for k in launches.chain(it.variants.iter().map(|(_, k)| k)) {
            if seen.insert(k.name.clone(), ()).is_none() {
                src.push_str(&k.source);
            }
        }
    }
    let t = Instant::now();
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(&src, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            let _ = std::fs::write("/tmp/cuda_kernels_failed.cu", &src);
            format!(
                "NVRTC rejects the module (source in /tmp/cuda_kernels_failed.cu):\n{}",
                log.to_string_lossy()
            )
        }
        e => format!("NVRTC: {e:?}"),
    })?;
    log(&format!(
        "compiled {} kernels ({} KiB of CUDA C) for {arch} in {:.1} s",
        seen.len(),
        src.len() / 1024,
        t.elapsed().as_secs_f64()
    ));
    let (module, functions) = device::load(ptx.to_src(), seen.keys().map(String::as_str))?;
    Ok(Loaded { module, functions })
}

pub(super) struct Buffers {
    pub(super) ptrs: Vec<sys::CUdeviceptr>,
}

impl Drop for Buffers {
    fn drop(&mut self) {
        for &p in &self.ptrs {
            device::free(p);
        }
    }
}

/// Runs `p`'s launches in order on `ins` and `outs`, its scratch at `scratch`.
pub(super) fn run_program(
    dev: &Loaded,
    p: &FusedProgram,
    ins: &[sys::CUdeviceptr],
    outs: &[sys::CUdeviceptr],
    scratch: sys::CUdeviceptr,
) -> Res<()> {
    for l in &p.launches {
        let args: Vec<sys::CUdeviceptr> = (l.args.iter())
            .map(|a| match *a {
                FusedArg::Input(n) => ins[n],
                FusedArg::Output(j) => outs[j],
                FusedArg::Scratch { offset, .. } => scratch + offset as u64,
            })
            .collect();
        launch(dev.functions[&l.kernel.name], &l.kernel, &args)?;
    }
    Ok(())
}

pub(super) struct Outcome {
    pub(super) ok: bool,
    pub(super) words: String,
    pub(super) micros: f64,
    pub(super) gbs: f64,
    /// One line per variant.
    pub(super) variants: Vec<String>,
}

/// Registers a thread, and local memory a thread if any (spills, or arrays indexed at run
/// time), as the loaded module says.
pub(super) fn resources(f: device::Function) -> String {
    match device::resources(f) {
        (regs, 0) => format!("{regs} regs"),
        (regs, local) => format!("{regs} regs, {local} B LOCAL"),
    }
}

/// Median time of 20 runs of `run` after 3 warm-ups, in milliseconds.
pub(super) fn time_ms(run: impl Fn() -> Res<()>) -> Res<f64> {
    device::time_ms(20, run)
}

/// Runs one kernel: upload, poison, launch, compare, time, and (if allowed) in place.
pub(super) fn check_one(
    dev: &Loaded,
    it: &Item,
    seed: u64,
    exact: bool,
    time: bool,
) -> Res<Outcome> {
    let (ins, outs) = it.work.buffers();
    let bytes: usize = ins.iter().chain(&outs).map(|&(d, n)| d.size() * n).sum();
    // Bytes a launch moves: every input and output once, except that gather reads only the
    // rows it picks and scatter-add touches only the rows it adds to.
    let moved = match &it.work {
        Work::Gather {
            table,
            ids,
            row_len,
            n,
            ..
        } => ids.size() * n + 2 * table.size() * n * row_len,
        Work::Scatter { op, .. } => op.ids.size() * op.n + 3 * op.values.size() * op.n * op.row_len,
        _ => bytes,
    };
    let (free, _) = driver("cuMemGetInfo", result::mem_get_info())?;
    if bytes + (256 << 20) > free {
        return Err(format!(
            "needs {} MiB, the device has {} MiB free",
            bytes >> 20,
            free >> 20
        ));
    }
    let tol = match &it.work {
        Work::Fused(k) => tolerances(k),
        // Moves, and scatter-add's sums in the CPU's order: the same bits.
        _ => vec![Tolerance::Exact; outs.len()],
    };
    let host_in = inputs_for(&it.work, seed, exact);
    let want = reference(&it.work, &host_in)?;
    let mut bufs = Buffers { ptrs: Vec::new() };
    for (b, &(d, n)) in host_in.iter().zip(&ins) {
        let p = alloc(d.size() * n)?;
        bufs.ptrs.push(p);
        device::upload(p, b)?;
    }
    let mut out_ptrs = Vec::new();
    for &(d, n) in &outs {
        let p = alloc(d.size() * n)?;
        bufs.ptrs.push(p);
        out_ptrs.push(p);
    }
    let poison = |ptrs: &[sys::CUdeviceptr]| -> Res<()> {
        for (&p, &(d, n)) in ptrs.iter().zip(&outs) {
            let v = if matches!(it.work, Work::Scatter { .. }) {
                0
            } else {
                0xFF
            };
            device::memset(p, v, d.size() * n)?;
        }
        Ok(())
    };
    let scratch = alloc(it.program.scratch_bytes)?;
    bufs.ptrs.push(scratch);
    let in_ptrs = bufs.ptrs[..ins.len()].to_vec();
    poison(&out_ptrs)?;
    run_program(dev, &it.program, &in_ptrs, &out_ptrs, scratch)?;
    sync()?;
    let mut ok = true;
    let mut words = Vec::new();
    let mut worst = 0f64;
    for (j, (&p, &(d, n))) in out_ptrs.iter().zip(&outs).enumerate() {
        let mut got = vec![0u8; d.size() * n];
        device::download(p, &mut got)?;
        let (o, e, w) = compare(d, &got, &want[j], tol[j]);
        ok &= o;
        worst = worst.max(e);
        if !o || outs.len() == 1 || e > 0.0 {
            words.push(format!("out{j} {w}"));
        }
    }
    let mut text = if words.is_empty() {
        format!("err {worst:.1e}")
    } else {
        words.join("; ")
    };
    // Timing.
    let (mut micros, mut gbs) = (f64::NAN, f64::NAN);
    if time {
        let med = time_ms(|| run_program(dev, &it.program, &in_ptrs, &out_ptrs, scratch))?;
        micros = med * 1e3;
        gbs = moved as f64 / (med * 1e-3) / 1e9;
        // The launches from the first that reads the last input on (a scatter-add's sums,
        // after the sort the runs above left in the scratch): what sits on a step's critical
        // path when the earlier launches read only what the step knows from its start.
        let last = FusedArg::Input(ins.len().saturating_sub(1));
        let first = (it.program.launches.iter()).position(|l| l.args.contains(&last));
        if let Some(k) = first.filter(|&k| k > 0) {
            let tail = FusedProgram {
                launches: it.program.launches[k..].to_vec(),
                scratch_bytes: it.program.scratch_bytes,
            };
            let med = time_ms(|| run_program(dev, &tail, &in_ptrs, &out_ptrs, scratch))?;
            text.push_str(&format!(
                "; the last {} launches {:.1} us",
                tail.launches.len(),
                med * 1e3
            ));
        }
    }
    // The other thread counts: poisoned outputs, compared, timed.
    let mut variants = Vec::new();
    for (t, vk) in &it.variants {
        let vf = dev.functions[&vk.name];
        let args: Vec<sys::CUdeviceptr> = in_ptrs.iter().chain(&out_ptrs).copied().collect();
        poison(&out_ptrs)?;
        launch(vf, vk, &args)?;
        sync()?;
        let mut vok = true;
        let mut bad = Vec::new();
        for (j, (&p, &(d, n))) in out_ptrs.iter().zip(&outs).enumerate() {
            let mut got = vec![0u8; d.size() * n];
            device::download(p, &mut got)?;
            let (o, _, w) = compare(d, &got, &want[j], tol[j]);
            if !o {
                vok = false;
                bad.push(format!("out{j} {w}"));
            }
        }
        ok &= vok;
        let med = time_ms(|| launch(vf, vk, &args))?;
        variants.push(format!(
            "{} {t:<22} block {:?} grid {:?} ({}) {:>9.1} us {:>7.1} GB/s{}",
            if vok { "ok  " } else { "FAIL" },
            vk.launch.block,
            vk.launch.grid,
            resources(vf),
            med * 1e3,
            moved as f64 / (med * 1e-3) / 1e9,
            if bad.is_empty() {
                String::new()
            } else {
                format!(" [{}]", bad.join("; "))
            }
        ));
    }
    // In place: an output written over an input it may take the memory of.
    if let Work::Fused(k) = &it.work {
        let pair = (0..k.inputs.len())
            .flat_map(|i| (0..k.outputs.len()).map(move |j| (i, j)))
            .find(|&(i, j)| k.can_write_over(i, j));
        if let Some((i, j)) = pair {
            // Fresh copies of every output, but output j is input i's buffer.
            let args = in_ptrs.clone();
            let mut fresh = Buffers { ptrs: Vec::new() };
            let mut outs_here = Vec::new();
            for (jj, &(d, n)) in outs.iter().enumerate() {
                if jj == j {
                    outs_here.push(args[i]);
                } else {
                    let p = alloc(d.size() * n)?;
                    fresh.ptrs.push(p);
                    outs_here.push(p);
                }
            }
            for (jj, (&p, &(d, n))) in outs_here.iter().zip(&outs).enumerate() {
                if jj != j {
                    device::memset(p, 0xFF, d.size() * n)?;
                }
            }
            // Input i must hold its data again (timing runs do not change inputs).
            device::upload(args[i], &host_in[i])?;
            run_program(dev, &it.program, &args, &outs_here, scratch)?;
            sync()?;
            let (d, n) = outs[j];
            let mut got = vec![0u8; d.size() * n];
            device::download(outs_here[j], &mut got)?;
            let (o, _, w) = compare(d, &got, &want[j], tol[j]);
            ok &= o;
            text += &if o {
                format!("; in place out{j}=in{i} ok")
            } else {
                format!("; in place out{j}=in{i} FAILS: {w}")
            };
        }
    }
    Ok(Outcome {
        ok,
        words: text,
        micros,
        gbs,
        variants,
    })
}

/// The kernel generated otherwise (`--variants`): at every other thread count per row (32 to
/// 1024, the blocks that give whole vectors, and 32 or 64 with a register cache up to 96
/// words) where it is a row-strategy kernel with full outputs and rows of at most 8192
/// elements; one element a thread where it is an elementwise kernel that goes four; at every
/// other number of rows a block (1 to 32) where it is a column-strategy kernel; and with every
/// load read at every element where some of its loads are guarded.
pub(super) fn variants_of(k: &FusedKernel, chosen: &CudaKernel) -> Vec<(String, CudaKernel)> {
    let mut out: Vec<(String, CudaKernel)> = Vec::new();
    let mut add = |what: String, t: cuda::Tuning| {
        if let Ok(v) = cuda::fused_tuned(k, t) {
            if v.name != chosen.name && out.iter().all(|(_, o)| o.name != v.name) {
                out.push((what, v));
            }
        }
    };
    match cuda::strategy(k) {
        Ok(cuda::Strategy::Elementwise) => add(
            "one element a thread".into(),
            cuda::Tuning {
                scalar_elementwise: true,
                ..Default::default()
            },
        ),
        Ok(cuda::Strategy::Rows) => {
            let n: usize = k.reduce_axes.iter().map(|&a| k.domain[a]).product();
            let full_out = k.outputs.iter().any(|o| !k.is_row_level(o.value));
            add(
                "one element a thread".into(),
                cuda::Tuning {
                    scalar_rows: true,
                    ..Default::default()
                },
            );
            if full_out && (2..=8192).contains(&n) {
                // Powers of two, and the blocks that give each thread a whole number of
                // vectors of 4 or 8 (192 or 96 threads for rows of 768).
                let mut counts = vec![32u32, 64, 128, 256, 512, 1024];
                for per in [4usize, 8] {
                    let t = n / per;
                    if n.is_multiple_of(per) && t.is_multiple_of(32) && (64..=1024).contains(&t) {
                        counts.push(t as u32);
                    }
                }
                counts.sort_unstable();
                counts.dedup();
                for t in counts {
                    if t as usize > n.next_power_of_two() {
                        break;
                    }
                    add(
                        format!("{t} threads a row"),
                        cuda::Tuning {
                            row_threads: Some(t),
                            ..Default::default()
                        },
                    );
                }
                // A warp (or two) a row with a register cache up to three times the default:
                // each lane's 32 (or 16) elements of a row of 1024 kept in vectors, several
                // rows a block, the reductions without a barrier.
                for t in [32u32, 64] {
                    add(
                        format!("{t} threads a row, cache up to 96 registers"),
                        cuda::Tuning {
                            row_threads: Some(t),
                            cache_words: Some(96),
                            ..Default::default()
                        },
                    );
                }
            }
        }
        Ok(cuda::Strategy::Columns) => {
            for x in [1u32, 2, 4, 8, 16, 32] {
                add(
                    format!("{x} rows a block"),
                    cuda::Tuning {
                        column_rows: Some(x),
                        ..Default::default()
                    },
                );
            }
        }
        _ => {}
    }
    add(
        "unguarded loads".into(),
        cuda::Tuning {
            unguarded_loads: true,
            ..Default::default()
        },
    );
    out
}
