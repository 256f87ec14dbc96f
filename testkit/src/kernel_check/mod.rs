//! The GPU's per-kernel numeric check: every distinct kernel of the given models' training
//! steps (fused kernels, gather, scatter-add, concat, dropout), or random fused kernels
//! ([`random::Options::exact`]), generated into one module, compiled once with NVRTC, run on
//! the GPU on seeded random inputs, and compared with the CPU reference
//! (`ingot_kernels::fused::cpu` for fused kernels, plain loops for the others).
//!
//! Shared by the test that runs it on the GPU machine (`testkit/tests/cuda_kernels.rs`) and the
//! measuring program (`testkit/examples/cuda_kernels.rs`), which also times each kernel (CUDA
//! events, median of 20 launches after 3 warm-ups, with its bandwidth: bytes of its inputs and
//! outputs over the time, for gather and scatter-add of the rows they touch) and, with
//! `variants`, every other way of generating it (`cuda::fused_tuned`).
//!
//! Floats pass when `max |gpu - cpu| / max(1, max |cpu|) <= 1e-5` (NaN where the CPU has NaN);
//! integers and bools must be equal. bf16 values ([`Tolerance`]): where the GPU's f32 arithmetic
//! is the CPU's (no exp, log or tanh, no division (approximate in bf16 kernels), no sum of
//! several terms, no product an add may fuse with, upstream of the value), the rounded bf16
//! must be the CPU's exactly (any NaN matching any NaN); where it may differ, one rounding to bf16 may land one bf16 ulp away, so the value
//! passes within one bf16 ulp at the output's scale (`2^-7` relative to `max(1, max |cpu|)`),
//! and a value computed from such a rounding (bf16 or f32) within four (`2^-5`). Random kernels are built so that integer results do not
//! depend on float rounding and are filled with exact values, so there GPU and CPU must agree
//! bit for bit. Outputs are filled with 0xFF bytes before each run, so an element the kernel
//! forgets to write shows. A fused kernel that may write an output over an input
//! (`FusedKernel::can_write_over`) is run that way too, and checked again.

use cudarc::driver::result;
use ingot_kernels::cuda;
use ingot_kernels::fused::random;
use ingot_kernels::DType;
use std::collections::HashMap;
use std::time::Instant;

use crate::device;

mod data;
mod reference;
mod run;
mod work;

use run::*;
use work::Res;
use work::*;

pub use reference::{tolerances, Tolerance};
pub use work::{collect, Item, Work};

/// Where the kernels come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Every distinct kernel of these models' training steps, compiled with these options
    /// ([`Source::models`] and [`Source::bf16_models`] for the defaults; say, bf16 with
    /// attention left as the plain math: `fuse_attention: false`). Boxed: the options are
    /// large beside the other variants.
    Models(Vec<String>, Box<ingot_compiler::pipeline::Options>),
    /// A random fused kernel ([`random::Options::exact`]) for each of these seeds.
    Random(std::ops::Range<u64>),
    /// Dropout kernels: f32, f64 and bf16, of 1, 4099 and 2^20 + 3 elements, at p 0, 0.1, 0.5
    /// and 1, with two salts.
    Dropout,
    /// Scatter-adds whose ids repeat in every way the table of ids must handle
    /// ([`SCATTER_CASES`]).
    Scatter,
}

/// `(ids, values, out, rows, row_len, n)` of [`Source::Scatter`]. The ids are drawn from
/// `-1..rows + 1`, so some are out of range: one row takes every position (rows 1); a few rows
/// take tens of thousands of positions each, runs of many chunks of 32 (rows 3, n 70,001);
/// most ids appear once (gpt2's token embedding on two ranks, and its bf16 rows summed
/// into f32); rows longer than a column panel (2,500); integer sums that wrap; one position;
/// none.
pub const SCATTER_CASES: [(DType, DType, DType, usize, usize, usize); 8] = [
    (DType::I64, DType::F32, DType::F32, 50257, 768, 16384),
    (DType::I64, DType::BF16, DType::F32, 50257, 768, 16384),
    (DType::I32, DType::BF16, DType::BF16, 3, 300, 70001),
    (DType::I64, DType::F64, DType::F64, 1, 5, 4099),
    (DType::I32, DType::I64, DType::I64, 1000, 2500, 3000),
    (DType::I64, DType::I32, DType::I32, 100, 33, 2049),
    (DType::I64, DType::F32, DType::F32, 7, 1, 1),
    (DType::I64, DType::F32, DType::F32, 5, 3, 0),
];

/// Scatter-add cases of [`Source::Scatter`] whose ids are drawn as word ids in text are
/// (`Fill::IdsSkewed`): a few rows take hundreds of positions each. gpt2's token embedding
/// gradient on two ranks and on one.
pub const SKEWED_SCATTER_CASES: [(DType, DType, DType, usize, usize, usize); 2] = [
    (DType::I64, DType::BF16, DType::F32, 50257, 768, 16384),
    (DType::I64, DType::BF16, DType::F32, 50257, 768, 8192),
];

impl Source {
    /// The kernels of these models' f32 training steps (default compile options).
    pub fn models(names: &[&str]) -> Source {
        Source::with_precision(names, ingot_compiler::precision::Precision::F32)
    }

    /// The same for the bf16 mixed-precision steps (`Precision::Bf16`).
    pub fn bf16_models(names: &[&str]) -> Source {
        Source::with_precision(names, ingot_compiler::precision::Precision::Bf16)
    }

    fn with_precision(names: &[&str], precision: ingot_compiler::precision::Precision) -> Source {
        let opts = ingot_compiler::pipeline::Options {
            precision: Some(precision),
            ..Default::default()
        };
        Source::Models(
            names.iter().map(|n| n.to_string()).collect(),
            Box::new(opts),
        )
    }
}

/// What else to do besides checking each kernel once.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckOptions {
    /// Time every kernel (20 launches after 3 warm-ups).
    pub time: bool,
    /// Also check and time every other way of generating each fused kernel.
    pub variants: bool,
}

/// How a run went.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Distinct kernels checked.
    pub kernels: usize,
    pub passed: usize,
    /// One line for each kernel that failed: its name, shape, error and where it came from.
    pub failures: Vec<String>,
}

/// The kernels of `source`, deduplicated by generated name, each with where it came from
/// ("gpt2 x12"). Needs no GPU.
pub fn kernels_of(source: &Source, variants: bool) -> Res<Vec<Item>> {
    let mut items: Vec<Item> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut uses: Vec<Vec<(String, usize)>> = Vec::new();
    let mut add = |work: Work, origin: &str, items: &mut Vec<Item>| -> Res<()> {
        let program = work.generate().map_err(|e| format!("{origin}: {e}"))?;
        let name = name_of(&program);
        match index.get(&name) {
            Some(&i) => {
                let u = &mut uses[i];
                match u.iter_mut().find(|(m, _)| m == origin) {
                    Some((_, c)) => *c += 1,
                    None => u.push((origin.to_string(), 1)),
                }
            }
            None => {
                index.insert(name, items.len());
                uses.push(vec![(origin.to_string(), 1)]);
                let variants = match &work {
                    Work::Fused(k) if variants => variants_of(k, &program.launches[0].kernel),
                    _ => Vec::new(),
                };
                items.push(Item {
                    program,
                    variants,
                    work,
                    origin: String::new(),
                });
            }
        }
        Ok(())
    };
    match source {
        Source::Random(seeds) => {
            let opts = random::Options::exact();
            for seed in seeds.clone() {
                let k = random::kernel(seed, &opts);
                add(
                    Work::Fused(Box::new(k)),
                    &format!("seed {seed}"),
                    &mut items,
                )?;
            }
        }
        Source::Dropout => {
            for dtype in [DType::F32, DType::F64, DType::BF16] {
                for n in [1, 4099, (1 << 20) + 3] {
                    for p in [0.0, 0.1, 0.5, 1.0] {
                        for salt in [0, 0x0123_4567_89ab_cdef] {
                            let w = Work::Dropout { dtype, n, p, salt };
                            add(w, &format!("dropout {dtype}"), &mut items)?;
                        }
                    }
                }
            }
        }
        Source::Scatter => {
            let cases = (SCATTER_CASES.iter().map(|&c| (c, false)))
                .chain(SKEWED_SCATTER_CASES.iter().map(|&c| (c, true)));
            for ((ids, values, out, rows, row_len, n), skewed) in cases {
                let op = cuda::ScatterAdd::of((ids, values, out), [rows, row_len, n]);
                let w = Work::Scatter { op, skewed };
                add(w, "scatter cases", &mut items)?;
            }
        }
        Source::Models(models, opts) => {
            for m in models {
                let model = ingot_models::by_name(m).map_err(|e| format!("{m}: {e}"))?;
                let c = ingot_compiler::pipeline::compile(&model, opts)
                    .map_err(|e| format!("{m}: {e}"))?;
                for w in collect(&c.graph) {
                    add(w, m, &mut items)?;
                }
            }
        }
    }
    for (it, u) in items.iter_mut().zip(&uses) {
        it.origin = u
            .iter()
            .map(|(m, c)| format!("{m} x{c}"))
            .collect::<Vec<_>>()
            .join(", ");
    }
    Ok(items)
}

/// Checks every kernel of `source` on GPU 0, writing a line per kernel (and, when timing, the
/// slowest) to `log`. An error is a setup failure (no driver or NVRTC, a kernel NVRTC rejects,
/// a model that does not compile); a kernel whose results differ is a failure in the summary.
pub fn check_kernels(
    source: &Source,
    opts: CheckOptions,
    log: &mut dyn FnMut(&str),
) -> Res<Summary> {
    let gpu = device::init()?;
    let items = kernels_of(source, opts.variants)?;
    let exact = matches!(source, Source::Random(_));
    let (major, minor) = gpu.compute;
    log(&format!("device: {} (compute {major}.{minor})", gpu.name));
    let (arch, dev) = (gpu.arch, gpu.device);
    let device = compile(&items, arch, log)?;

    let t0 = Instant::now();
    let mut summary = Summary {
        kernels: items.len(),
        ..Summary::default()
    };
    let mut slow: Vec<(f64, String)> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let t = Instant::now();
        let r = check_one(&device, it, 1 + i as u64, exact, opts.time);
        let launches: Vec<String> = (it.program.launches.iter())
            .map(|l| {
                format!(
                    "grid {:?} block {:?} ({})",
                    l.kernel.launch.grid,
                    l.kernel.launch.block,
                    resources(device.functions[&l.kernel.name]),
                )
            })
            .collect();
        let head = format!(
            "{} {:<11} {:<48} {}",
            it.name(),
            it.work.kind(),
            it.work.shape(),
            launches.join(" then "),
        );
        let description = || match &it.work {
            Work::Fused(k) => format!("\n{k}"),
            _ => String::new(),
        };
        match r {
            Ok(o) => {
                let status = if o.ok { "ok" } else { "FAIL" };
                let timing = if o.micros.is_nan() {
                    String::new()
                } else {
                    format!(" {:>9.1} us {:>7.1} GB/s", o.micros, o.gbs)
                };
                log(&format!(
                    "{status:<4} {head}{timing} [{}] ({}; {:.1} s)",
                    o.words,
                    it.origin,
                    t.elapsed().as_secs_f64()
                ));
                for v in &o.variants {
                    log(&format!("       {v}"));
                }
                if !o.micros.is_nan() {
                    slow.push((o.micros, format!("{} {}", it.name(), it.work.shape())));
                }
                if o.ok {
                    summary.passed += 1;
                } else {
                    summary.failures.push(format!(
                        "{head} [{}] ({}){}",
                        o.words,
                        it.origin,
                        description()
                    ));
                }
            }
            Err(e) => {
                let line = format!("{head}: {e} ({}){}", it.origin, description());
                log(&format!("FAIL {line}"));
                summary.failures.push(line);
            }
        }
    }
    slow.sort_by(|a, b| b.0.total_cmp(&a.0));
    if !slow.is_empty() {
        log("slowest:");
        for (us, what) in slow.iter().take(8) {
            log(&format!("  {us:>10.1} us  {what}"));
        }
    }
    log(&format!(
        "{} passed, {} failed, of {} distinct kernels ({:.1} s)",
        summary.passed,
        summary.failures.len(),
        items.len(),
        t0.elapsed().as_secs_f64()
    ));
    // SAFETY: every launch has finished (each check ends in `sync`) and no function of
    // the module is used after this; the context retained above is released once.
    unsafe {
        let _ = result::module::unload(device.module);
        let _ = result::primary_ctx::release(dev);
    }
    Ok(summary)
}

/// [`check_kernels`] with the default options as a test: each line printed, and a failure
/// where setting up fails, `source` gives no kernels or any kernel differs from the CPU.
pub fn assert_kernels_pass(source: &Source) {
    let summary = check_kernels(source, CheckOptions::default(), &mut |l| eprintln!("{l}"))
        .unwrap_or_else(|e| panic!("{source:?}: {e}"));
    assert!(summary.kernels > 0, "{source:?} gave no kernels");
    assert!(
        summary.failures.is_empty(),
        "{source:?}: {} of {} kernels differ from the CPU:\n{}",
        summary.failures.len(),
        summary.kernels,
        summary.failures.join("\n")
    );
}

#[cfg(test)]
mod tests;
