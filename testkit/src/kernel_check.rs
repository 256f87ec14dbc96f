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

use cudarc::driver::{result, sys};
use ingot_compiler::ir::{Graph, Op};
use ingot_kernels::cuda::{self, CudaKernel, FusedArg, FusedProgram, PRELUDE, PRELUDE_BF16};
use ingot_kernels::fused::random;
use ingot_kernels::fused::{cpu, FusedKernel, Inst};
use ingot_kernels::{BinaryOp, DType, UnaryOp};
use std::collections::HashMap;
use std::time::Instant;

type Res<T> = Result<T, String>;
/// (dtype, elements) of each buffer.
type Shapes = Vec<(DType, usize)>;

use crate::device::{self, alloc, driver, launch, sync};

// ---------------------------------------------------------------------------------------------
// What to run.

/// One kernel to check.
#[derive(Clone, Debug)]
pub enum Work {
    Fused(Box<FusedKernel>),
    Gather {
        table: DType,
        ids: DType,
        rows: usize,
        row_len: usize,
        n: usize,
    },
    Scatter {
        ids: DType,
        values: DType,
        /// The sum's type: the values', or f32 for bf16 values.
        out: DType,
        rows: usize,
        row_len: usize,
        n: usize,
        /// Ids drawn log-uniformly (as words in text: id 0 at about 6% of the positions),
        /// not uniformly.
        skewed: bool,
    },
    Concat {
        dtype: DType,
        outer: usize,
        widths: Vec<usize>,
    },
    /// `dropout(x [n], seed)` (its CPU reference: `ingot_kernels::rng`, bf16 widened).
    Dropout {
        dtype: DType,
        n: usize,
        p: f64,
        salt: u64,
    },
}

/// A distinct kernel to check, generated: the launches that compute it (one, or a split
/// column reduction's two, [`cuda::fused_program`]).
pub struct Item {
    pub program: FusedProgram,
    /// The same work generated otherwise, and how (`variants`).
    pub variants: Vec<(String, CudaKernel)>,
    pub work: Work,
    /// Where it came from ("gpt2 x12").
    pub origin: String,
}

impl Item {
    /// The first launch's kernel (the only one, unless the work is split).
    pub fn kernel(&self) -> &CudaKernel {
        &self.program.launches[0].kernel
    }

    /// The names of its launches' kernels, joined: what makes two items the same.
    fn name(&self) -> String {
        name_of(&self.program)
    }
}

fn name_of(p: &FusedProgram) -> String {
    let names: Vec<&str> = p.launches.iter().map(|l| l.kernel.name.as_str()).collect();
    names.join("+")
}

impl Work {
    /// The launches that run this work: a fused kernel's program, scatter-add's three, or one
    /// kernel.
    fn generate(&self) -> Res<FusedProgram> {
        let one = |k: Result<CudaKernel, cuda::CodegenError>| {
            let (ins, outs) = self.buffers();
            k.map(|k| FusedProgram::one(k, ins.len(), outs.len()))
        };
        let r = match self {
            Work::Fused(k) => cuda::fused_program(k),
            Work::Scatter {
                ids,
                values,
                out,
                rows,
                row_len,
                n,
                ..
            } => cuda::scatter_add_program(*ids, *values, *out, *rows, *row_len, *n),
            Work::Gather {
                table,
                ids,
                rows,
                row_len,
                n,
            } => one(cuda::gather(*table, *ids, *rows, *row_len, *n)),
            Work::Concat {
                dtype,
                outer,
                widths,
            } => one(cuda::concat(*dtype, *outer, widths)),
            Work::Dropout { dtype, n, p, salt } => one(cuda::dropout(*dtype, *n, *p, *salt)),
        };
        r.map_err(|e| e.to_string())
    }

    fn kind(&self) -> &'static str {
        match self {
            Work::Fused(_) => "fused",
            Work::Gather { .. } => "gather",
            Work::Scatter { .. } => "scatter_add",
            Work::Concat { .. } => "concat",
            Work::Dropout { .. } => "dropout",
        }
    }

    /// Domain, reduce axes and strategy, in words.
    fn shape(&self) -> String {
        match self {
            Work::Fused(k) => format!(
                "domain {:?} reduce {:?} {}",
                k.domain,
                k.reduce_axes,
                cuda::strategy(k).map_or("?", |s| s.name())
            ),
            Work::Gather {
                rows, row_len, n, ..
            } => format!("{n} ids into [{rows},{row_len}]"),
            Work::Scatter {
                rows,
                row_len,
                n,
                skewed,
                ..
            } => format!(
                "{n} rows of {row_len} into {rows}{}",
                if *skewed { ", skewed ids" } else { "" }
            ),
            Work::Concat { outer, widths, .. } => format!("[{outer}, {widths:?}]"),
            Work::Dropout { n, p, .. } => format!("{n} elements, p {p}"),
        }
    }

    /// (dtype, elements) of each input and each output, in parameter order.
    fn buffers(&self) -> (Shapes, Shapes) {
        match self {
            Work::Fused(k) => (
                k.inputs.iter().map(|i| (i.dtype, i.len)).collect(),
                (0..k.outputs.len())
                    .map(|j| (k.output_dtype(j), k.output_len(j)))
                    .collect(),
            ),
            Work::Gather {
                table,
                ids,
                rows,
                row_len,
                n,
            } => (
                vec![(*table, rows * row_len), (*ids, *n)],
                vec![(*table, n * row_len)],
            ),
            Work::Scatter {
                ids,
                values,
                out,
                rows,
                row_len,
                n,
                ..
            } => (
                vec![(*ids, *n), (*values, n * row_len)],
                vec![(*out, rows * row_len)],
            ),
            Work::Concat {
                dtype,
                outer,
                widths,
            } => (
                widths.iter().map(|w| (*dtype, outer * w)).collect(),
                vec![(*dtype, outer * widths.iter().sum::<usize>())],
            ),
            Work::Dropout { dtype, n, .. } => {
                (vec![(*dtype, *n), (DType::I64, 1)], vec![(*dtype, *n)])
            }
        }
    }
}

/// Every fused kernel, gather, scatter-add and concat of a compiled graph.
pub fn collect(graph: &Graph) -> Vec<Work> {
    let mut out = Vec::new();
    for node in graph.nodes() {
        match &node.op {
            Op::Fused(k) => out.push(Work::Fused(k.clone())),
            Op::Gather => {
                let (table, ids) = (graph.ty(node.inputs[0]), graph.ty(node.inputs[1]));
                let dims = table.shape.dims();
                out.push(Work::Gather {
                    table: table.dtype,
                    ids: ids.dtype,
                    rows: dims.first().copied().unwrap_or(1),
                    row_len: dims.iter().skip(1).product(),
                    n: ids.shape.numel(),
                });
            }
            Op::ScatterAdd { rows } => {
                let (ids, values) = (graph.ty(node.inputs[0]), graph.ty(node.inputs[1]));
                let n = ids.shape.numel();
                out.push(Work::Scatter {
                    ids: ids.dtype,
                    values: values.dtype,
                    out: node.ty.dtype,
                    rows: *rows,
                    row_len: values.shape.numel().checked_div(n).unwrap_or(0),
                    n,
                    skewed: false,
                });
            }
            Op::Dropout { p, salt } => out.push(Work::Dropout {
                dtype: node.ty.dtype,
                n: node.ty.shape.numel(),
                p: *p,
                salt: *salt,
            }),
            Op::Concat { axis } => {
                let dims = node.ty.shape.dims();
                out.push(Work::Concat {
                    dtype: node.ty.dtype,
                    outer: dims[..*axis].iter().product(),
                    widths: node
                        .inputs
                        .iter()
                        .map(|&x| graph.ty(x).shape.dims()[*axis..].iter().product())
                        .collect(),
                });
            }
            _ => {}
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Data.

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// How to fill a buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fill {
    /// Floats: triangular in [-2, 2]; integers in [0, 64); bools 0/1.
    Signed,
    /// Floats in [0.01, 2] (inputs that reach a sqrt or log); otherwise as `Signed`.
    Positive,
    /// Integers in [0, n) (ids).
    Ids(u64),
    /// Integers in [-1, n + 1) (ids, some of them out of range).
    IdsAround(u64),
    /// Integers in [0, n), log-uniform: `k` about as often as `1 / (k + 1)` (word ids in text).
    IdsSkewed(u64),
    /// Exact values: floats multiples of 1/8 in [-4, 4] with some NaN, ±inf, ±0, 1e20 and
    /// 2^31 (random mode); integers in [-20, 20] with some extremes.
    Exact,
}

fn fill(dtype: DType, len: usize, how: Fill, seed: u64) -> Vec<u8> {
    let mut r = XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut out = Vec::with_capacity(len * dtype.size());
    for _ in 0..len {
        let special = how == Fill::Exact && r.below(100) < 8;
        let f = match how {
            Fill::Positive => 0.01 + 1.99 * r.unit(),
            Fill::Exact if special => [
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                -0.0,
                0.0,
                1e20,
                -1e20,
                2147483648.0,
            ][r.below(8) as usize],
            Fill::Exact => (r.below(65) as f64 - 32.0) / 8.0,
            _ => 2.0 * (r.unit() + r.unit() - 1.0),
        };
        let i: i64 = match how {
            Fill::Ids(n) => r.below(n) as i64,
            Fill::IdsAround(n) => r.below(n + 2) as i64 - 1,
            Fill::IdsSkewed(n) => {
                (((n as f64 + 1.0).ln() * r.unit()).exp() as i64 - 1).clamp(0, n as i64 - 1)
            }
            Fill::Exact if special => {
                [i64::MAX, i64::MIN, -1, i32::MAX as i64, i32::MIN as i64][r.below(5) as usize]
            }
            Fill::Exact => r.below(41) as i64 - 20,
            _ => r.below(64) as i64,
        };
        match dtype {
            DType::F32 => out.extend_from_slice(&(f as f32).to_ne_bytes()),
            DType::F64 => out.extend_from_slice(&f.to_ne_bytes()),
            DType::I32 => out.extend_from_slice(&(i as i32).to_ne_bytes()),
            DType::I64 => out.extend_from_slice(&i.to_ne_bytes()),
            DType::Bool => out.push((r.next() & 1) as u8),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(f).to_bits().to_ne_bytes()),
        }
    }
    out
}

/// Inputs whose values reach a sqrt or log through ops that keep positive values positive
/// (add, mul, div, max, min, select, sums, converts, recip): filled with positive values, so
/// that an optimizer's `sqrt(v)` is not NaN everywhere.
fn positive_inputs(k: &FusedKernel) -> Vec<bool> {
    let n = k.body.len();
    let mut mark = vec![false; n];
    for inst in &k.body {
        if let Inst::Unary {
            op: UnaryOp::Sqrt | UnaryOp::Log,
            x,
        } = *inst
        {
            mark[x] = true;
        }
    }
    let mut pos = vec![false; k.inputs.len()];
    for i in (0..n).rev() {
        if !mark[i] {
            continue;
        }
        match k.body[i] {
            Inst::Load { input } => pos[input] = true,
            Inst::Binary {
                op: BinaryOp::Add | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Max | BinaryOp::Min,
                a,
                b,
            } => {
                mark[a] = true;
                mark[b] = true;
            }
            Inst::Select { a, b, .. } => {
                mark[a] = true;
                mark[b] = true;
            }
            Inst::Reduce { x, .. }
            | Inst::Convert { x, .. }
            | Inst::Unary {
                op: UnaryOp::Recip | UnaryOp::Sqrt,
                x,
            } => mark[x] = true,
            _ => {}
        }
    }
    pos
}

fn inputs_for(work: &Work, seed: u64, exact: bool) -> Vec<Vec<u8>> {
    let (ins, _) = work.buffers();
    let pos = match work {
        Work::Fused(k) => positive_inputs(k),
        _ => vec![false; ins.len()],
    };
    ins.iter()
        .enumerate()
        .map(|(i, &(dt, len))| {
            let how = match work {
                _ if exact => Fill::Exact,
                Work::Gather { rows, .. } if i == 1 => Fill::Ids(*rows as u64),
                Work::Scatter {
                    rows, skewed: true, ..
                } if i == 0 => Fill::IdsSkewed(*rows as u64),
                Work::Scatter { rows, .. } if i == 0 => Fill::IdsAround(*rows as u64),
                _ if pos[i] => Fill::Positive,
                _ => Fill::Signed,
            };
            fill(dt, len, how, seed.wrapping_add(i as u64 * 7919))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// CPU references.

fn reference(work: &Work, inputs: &[Vec<u8>]) -> Res<Vec<Vec<u8>>> {
    match work {
        Work::Fused(k) => {
            let ins: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
            cpu::run_buffers(k, &ins).map_err(|e| e.to_string())
        }
        Work::Gather {
            table,
            ids,
            rows,
            row_len,
            n,
        } => {
            let s = table.size();
            let mut out = vec![0u8; n * row_len * s];
            for r in 0..*n {
                let id = read_int(*ids, &inputs[1], r);
                if id >= 0 && (id as u64) < *rows as u64 {
                    let src = &inputs[0][id as usize * row_len * s..][..row_len * s];
                    out[r * row_len * s..][..row_len * s].copy_from_slice(src);
                }
            }
            Ok(vec![out])
        }
        Work::Scatter {
            ids,
            values,
            out,
            rows,
            row_len,
            n,
            ..
        } => {
            let s = values.size();
            if *values == DType::BF16 {
                let sums = scatter_bf16(*ids, inputs, *rows, *row_len, *n);
                return Ok(vec![match out {
                    DType::F32 => sums.iter().flat_map(|x| x.to_ne_bytes()).collect(),
                    _ => sums
                        .iter()
                        .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_ne_bytes())
                        .collect(),
                }]);
            }
            let mut out = vec![0u8; rows * row_len * s];
            for r in 0..*n {
                let id = read_int(*ids, &inputs[0], r);
                if id < 0 || id as u64 >= *rows as u64 {
                    continue;
                }
                for c in 0..*row_len {
                    let (o, v) = ((id as usize * row_len + c) * s, (r * row_len + c) * s);
                    add_into(*values, &mut out[o..o + s], &inputs[1][v..v + s]);
                }
            }
            Ok(vec![out])
        }
        Work::Concat {
            dtype,
            outer,
            widths,
        } => {
            let s = dtype.size();
            let total: usize = widths.iter().sum();
            let mut out = vec![0u8; outer * total * s];
            for o in 0..*outer {
                let mut at = 0;
                for (i, &w) in widths.iter().enumerate() {
                    out[(o * total + at) * s..][..w * s]
                        .copy_from_slice(&inputs[i][o * w * s..][..w * s]);
                    at += w;
                }
            }
            Ok(vec![out])
        }
        Work::Dropout { dtype, n, p, salt } => {
            use ingot_kernels::rng;
            let seed = read_int(DType::I64, &inputs[1], 0) as u64;
            let x = &inputs[0];
            let out: Vec<u8> = match dtype {
                DType::F64 => {
                    let xs: Vec<f64> = (0..*n)
                        .map(|i| f64::from_ne_bytes(x[i * 8..i * 8 + 8].try_into().unwrap()))
                        .collect();
                    let mut o = vec![0f64; *n];
                    rng::dropout_f64(&xs, &mut o, seed, *salt, *p);
                    o.iter().flat_map(|v| v.to_ne_bytes()).collect()
                }
                DType::F32 | DType::BF16 => {
                    let xs: Vec<f32> = (0..*n)
                        .map(|i| match dtype {
                            DType::F32 => {
                                f32::from_ne_bytes(x[i * 4..i * 4 + 4].try_into().unwrap())
                            }
                            _ => {
                                half::bf16::from_bits(u16::from_ne_bytes([x[2 * i], x[2 * i + 1]]))
                                    .to_f32()
                            }
                        })
                        .collect();
                    let mut o = vec![0f32; *n];
                    rng::dropout_f32(&xs, &mut o, seed, *salt, *p);
                    match dtype {
                        DType::F32 => o.iter().flat_map(|v| v.to_ne_bytes()).collect(),
                        _ => o
                            .iter()
                            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_ne_bytes())
                            .collect(),
                    }
                }
                other => return Err(format!("dropout is not defined for {other}")),
            };
            Ok(vec![out])
        }
    }
}

/// The bf16 scatter-add reference: each row's sum in f32, in position order (as the CPU
/// executor computes it, `runtime/src/cpu/bf16.rs`), rounded once by the caller for a bf16
/// result.
fn scatter_bf16(ids: DType, inputs: &[Vec<u8>], rows: usize, row_len: usize, n: usize) -> Vec<f32> {
    let widen = |b: &[u8], i: usize| {
        half::bf16::from_bits(u16::from_ne_bytes([b[2 * i], b[2 * i + 1]])).to_f32()
    };
    let mut acc = vec![0f32; rows * row_len];
    for r in 0..n {
        let id = read_int(ids, &inputs[0], r);
        if id < 0 || id as u64 >= rows as u64 {
            continue;
        }
        for c in 0..row_len {
            acc[id as usize * row_len + c] += widen(&inputs[1], r * row_len + c);
        }
    }
    acc
}

fn read_int(dt: DType, b: &[u8], i: usize) -> i64 {
    match dt {
        DType::I32 => i32::from_ne_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as i64,
        _ => i64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()),
    }
}

fn add_into(dt: DType, acc: &mut [u8], v: &[u8]) {
    match dt {
        DType::F32 => {
            let x = f32::from_ne_bytes(acc.try_into().unwrap())
                + f32::from_ne_bytes(v.try_into().unwrap());
            acc.copy_from_slice(&x.to_ne_bytes());
        }
        DType::F64 => {
            let x = f64::from_ne_bytes(acc.try_into().unwrap())
                + f64::from_ne_bytes(v.try_into().unwrap());
            acc.copy_from_slice(&x.to_ne_bytes());
        }
        DType::I32 => {
            let x = i32::from_ne_bytes(acc.try_into().unwrap())
                .wrapping_add(i32::from_ne_bytes(v.try_into().unwrap()));
            acc.copy_from_slice(&x.to_ne_bytes());
        }
        DType::I64 => {
            let x = i64::from_ne_bytes(acc.try_into().unwrap())
                .wrapping_add(i64::from_ne_bytes(v.try_into().unwrap()));
            acc.copy_from_slice(&x.to_ne_bytes());
        }
        // bf16 sums are made in f32 by `scatter_bf16`.
        DType::Bool | DType::BF16 => {}
    }
}

/// How closely an output must match the CPU's (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tolerance {
    /// The GPU's arithmetic is the CPU's: a bf16 output is exact (an f32 one is still held to
    /// 1e-5: the f32 kernels' rule).
    Exact,
    /// The value's own f32 arithmetic may differ (1e-5 for f32; one bf16 ulp at scale for bf16).
    Drift,
    /// A bf16 rounding of a drifting value is upstream: four bf16 ulps at scale.
    Coarse,
}

impl Tolerance {
    /// The largest scaled error that passes for an output of `dt`.
    fn bound(self, dt: DType) -> f64 {
        match (self, dt) {
            (Tolerance::Coarse, _) => 1.0 / 32.0,
            (_, DType::BF16) => 1.0 / 128.0,
            _ => 1e-5,
        }
    }
}

/// The tolerance of each output of `k` ([`Tolerance`]): whether the GPU's f32 arithmetic may
/// differ from the CPU's somewhere upstream of it (exp, log and tanh are different functions,
/// and a bf16 kernel's division and reciprocal the hardware's approximation; a sum of several terms adds in another order; an f32 product feeding an add or subtract may
/// become a fused multiply-add), and whether a bf16 rounding of such a value is.
pub fn tolerances(k: &FusedKernel) -> Vec<Tolerance> {
    let dt = k.dtypes();
    if !k.holds_bf16() {
        // Kernels without bf16 keep the f32 kernels' rule (1e-5) for every float output.
        return vec![Tolerance::Drift; k.outputs.len()];
    }
    let n = k.body.len();
    let (mut drift, mut coarse) = (vec![false; n], vec![false; n]);
    let reduced: usize = k.reduce_axes.iter().map(|&a| k.domain[a]).product();
    let is_mul = |j: usize| {
        matches!(
            k.body[j],
            Inst::Binary {
                op: BinaryOp::Mul,
                ..
            }
        ) && dt[j] != DType::BF16
    };
    for i in 0..n {
        let ops: Vec<usize> = match k.body[i] {
            Inst::Load { .. } | Inst::Const { .. } | Inst::Index { .. } => vec![],
            Inst::Unary { x, .. } | Inst::Convert { x, .. } | Inst::Reduce { x, .. } => vec![x],
            Inst::Binary { a, b, .. } | Inst::Compare { a, b, .. } => vec![a, b],
            Inst::Select { cond, a, b } => vec![cond, a, b],
        };
        let own = match k.body[i] {
            Inst::Unary {
                op: UnaryOp::Exp | UnaryOp::Log | UnaryOp::Tanh | UnaryOp::Recip,
                ..
            } => true,
            // A kernel holding bf16 divides by the hardware's approximation (`ig_fdiv`).
            Inst::Binary {
                op: BinaryOp::Div, ..
            } => true,
            Inst::Reduce { .. } => reduced > 1,
            Inst::Binary {
                op: BinaryOp::Add | BinaryOp::Sub,
                a,
                b,
            } => dt[i] != DType::BF16 && (is_mul(a) || is_mul(b)),
            _ => false,
        };
        // A bf16 result rounds (and a comparison decides) on a value that may drift: it may
        // then land one bf16 ulp away (or flip), and so may everything computed from it.
        let jumps = |j: usize| {
            drift[j] && (dt[j] == DType::BF16 || matches!(k.body[j], Inst::Compare { .. }))
        };
        coarse[i] = ops.iter().any(|&j| coarse[j] || jumps(j));
        drift[i] = own || coarse[i] || ops.iter().any(|&j| drift[j]);
    }
    k.outputs
        .iter()
        .map(|o| {
            let v = o.value;
            if coarse[v] {
                Tolerance::Coarse
            } else if drift[v] {
                Tolerance::Drift
            } else {
                Tolerance::Exact
            }
        })
        .collect()
}

/// `(ok, worst error, words)`: floats by relative error against `max(1, max |cpu|)`, NaN
/// matching NaN; integers and bools exactly; bf16 by `tol` ([`Tolerance`]).
fn compare(dt: DType, gpu: &[u8], cpu: &[u8], tol: Tolerance) -> (bool, f64, String) {
    if gpu.len() != cpu.len() {
        return (false, f64::INFINITY, "lengths differ".into());
    }
    let bound = tol.bound(dt);
    let floats = |g: Vec<f64>, c: Vec<f64>| {
        let scale = c
            .iter()
            .filter(|x| x.is_finite())
            .fold(1f64, |m, x| m.max(x.abs()));
        let (mut worst, mut at, mut nan_bad, mut inf_bad) = (0f64, 0usize, 0usize, 0usize);
        for (i, (&g, &c)) in g.iter().zip(&c).enumerate() {
            if c.is_nan() || g.is_nan() {
                nan_bad += usize::from(c.is_nan() != g.is_nan());
                continue;
            }
            if c.is_infinite() || g.is_infinite() {
                inf_bad += usize::from(c != g);
                continue;
            }
            let e = (g - c).abs() / scale;
            if e > worst {
                worst = e;
                at = i;
            }
        }
        let ok = worst <= bound && nan_bad == 0 && inf_bad == 0;
        let mut words = format!("{worst:.1e}");
        if worst > bound {
            words += &format!(" at {at} (gpu {} cpu {})", g[at], c[at]);
        }
        if nan_bad + inf_bad > 0 {
            words += &format!(" ({nan_bad} NaN and {inf_bad} inf mismatches)");
        }
        (ok, worst, words)
    };
    let bf16s = |b: &[u8]| -> Vec<f64> {
        b.chunks_exact(2)
            .map(|b| half::bf16::from_bits(u16::from_ne_bytes([b[0], b[1]])).to_f64())
            .collect()
    };
    match dt {
        DType::BF16 if tol == Tolerance::Exact => {
            let (g, c) = (bf16s(gpu), bf16s(cpu));
            // Equal values (any NaN matching any NaN: the payloads of NaNs that arithmetic
            // makes differ between the GPU and the host).
            let bad: Vec<usize> = (0..g.len())
                .filter(|&i| !(g[i] == c[i] || (g[i].is_nan() && c[i].is_nan())))
                .collect();
            match bad.first() {
                None => (true, 0.0, "exact".into()),
                Some(&i) => (
                    false,
                    f64::INFINITY,
                    format!(
                        "{} of {} bf16 values differ, first at {i} (gpu {} cpu {})",
                        bad.len(),
                        g.len(),
                        g[i],
                        c[i]
                    ),
                ),
            }
        }
        DType::BF16 => floats(bf16s(gpu), bf16s(cpu)),
        DType::F32 => floats(
            gpu.chunks_exact(4)
                .map(|b| f32::from_ne_bytes(b.try_into().unwrap()) as f64)
                .collect(),
            cpu.chunks_exact(4)
                .map(|b| f32::from_ne_bytes(b.try_into().unwrap()) as f64)
                .collect(),
        ),
        DType::F64 => floats(
            gpu.chunks_exact(8)
                .map(|b| f64::from_ne_bytes(b.try_into().unwrap()))
                .collect(),
            cpu.chunks_exact(8)
                .map(|b| f64::from_ne_bytes(b.try_into().unwrap()))
                .collect(),
        ),
        _ => {
            let s = dt.size();
            let bad: Vec<usize> = (0..gpu.len() / s)
                .filter(|&i| gpu[i * s..(i + 1) * s] != cpu[i * s..(i + 1) * s])
                .collect();
            match bad.first() {
                None => (true, 0.0, "exact".into()),
                Some(&i) => (
                    false,
                    f64::INFINITY,
                    format!(
                        "{} of {} differ, first at {i} (gpu {:?} cpu {:?})",
                        bad.len(),
                        gpu.len() / s,
                        &gpu[i * s..(i + 1) * s],
                        &cpu[i * s..(i + 1) * s]
                    ),
                ),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The device.

struct Loaded {
    module: sys::CUmodule,
    functions: HashMap<String, device::Function>,
}

fn compile(items: &[Item], arch: &'static str, log: &mut dyn FnMut(&str)) -> Res<Loaded> {
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

struct Buffers {
    ptrs: Vec<sys::CUdeviceptr>,
}

impl Drop for Buffers {
    fn drop(&mut self) {
        for &p in &self.ptrs {
            device::free(p);
        }
    }
}

/// Runs `p`'s launches in order on `ins` and `outs`, its scratch at `scratch`.
fn run_program(
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

struct Outcome {
    ok: bool,
    words: String,
    micros: f64,
    gbs: f64,
    /// One line per variant.
    variants: Vec<String>,
}

/// Registers a thread, and local memory a thread if any (spills, or arrays indexed at run
/// time), as the loaded module says.
fn resources(f: device::Function) -> String {
    match device::resources(f) {
        (regs, 0) => format!("{regs} regs"),
        (regs, local) => format!("{regs} regs, {local} B LOCAL"),
    }
}

/// Median time of 20 runs of `run` after 3 warm-ups, in milliseconds.
fn time_ms(run: impl Fn() -> Res<()>) -> Res<f64> {
    device::time_ms(20, run)
}

/// Runs one kernel: upload, poison, launch, compare, time, and (if allowed) in place.
fn check_one(dev: &Loaded, it: &Item, seed: u64, exact: bool, time: bool) -> Res<Outcome> {
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
        Work::Scatter {
            ids,
            values,
            row_len,
            n,
            ..
        } => ids.size() * n + 3 * values.size() * n * row_len,
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
fn variants_of(k: &FusedKernel, chosen: &CudaKernel) -> Vec<(String, CudaKernel)> {
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

// ---------------------------------------------------------------------------------------------
// The check.

/// Where the kernels come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Every distinct kernel of these models' training steps, compiled with these options
    /// ([`Source::models`] and [`Source::bf16_models`] for the defaults; say, bf16 with
    /// attention left as the plain math: `fuse_attention: false`).
    Models(Vec<String>, ingot_compiler::pipeline::Options),
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
        Source::Models(names.iter().map(|n| n.to_string()).collect(), opts)
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
                let w = Work::Scatter {
                    ids,
                    values,
                    out,
                    rows,
                    row_len,
                    n,
                    skewed,
                };
                add(w, "scatter cases", &mut items)?;
            }
        }
        Source::Models(models, opts) => {
            for m in models {
                let model = ingot_compiler::models::by_name(m).map_err(|e| format!("{m}: {e}"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(xs: &[f32]) -> Vec<u8> {
        xs.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn floats_pass_within_the_tolerance_and_nan_must_match_nan() {
        let cpu = f32s(&[1.0, f32::NAN, -2.0, f32::INFINITY]);
        assert!(compare(DType::F32, &cpu, &cpu, Tolerance::Drift).0);
        assert!(
            compare(
                DType::F32,
                &f32s(&[1.000001, f32::NAN, -2.0, f32::INFINITY]),
                &cpu,
                Tolerance::Drift
            )
            .0
        );
        assert!(
            !compare(
                DType::F32,
                &f32s(&[1.001, f32::NAN, -2.0, f32::INFINITY]),
                &cpu,
                Tolerance::Drift
            )
            .0
        );
        assert!(
            !compare(
                DType::F32,
                &f32s(&[1.0, 0.0, -2.0, f32::INFINITY]),
                &cpu,
                Tolerance::Drift
            )
            .0
        );
        assert!(
            !compare(
                DType::F32,
                &f32s(&[1.0, f32::NAN, -2.0, f32::MAX]),
                &cpu,
                Tolerance::Drift
            )
            .0
        );
        // An unwritten output (0xFF bytes) is a NaN where the CPU has a number.
        assert!(!compare(DType::F32, &[0xFF; 16], &cpu, Tolerance::Drift).0);
        assert!(!compare(DType::I32, &[0, 0, 0, 1], &[0, 0, 0, 0], Tolerance::Exact).0);
        assert!(!compare(DType::F32, &cpu[..8], &cpu, Tolerance::Drift).0);
    }

    fn bf16s(xs: &[f32]) -> Vec<u8> {
        xs.iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_ne_bytes())
            .collect()
    }

    #[test]
    fn bf16_values_are_exact_where_the_arithmetic_is_and_within_an_ulp_where_it_drifts() {
        let cpu = bf16s(&[1.0, 0.5, -3.0, f32::NAN]);
        // 1 + 2^-7 is one bf16 ulp above 1; a NaN of another payload is a NaN.
        let one_ulp = bf16s(&[1.0078125, 0.5, -3.0, -f32::NAN]);
        let far = bf16s(&[1.0625, 0.5, -3.0, f32::NAN]);
        assert!(compare(DType::BF16, &cpu, &cpu, Tolerance::Exact).0);
        assert!(
            compare(
                DType::BF16,
                &bf16s(&[1.0, 0.5, -3.0, -f32::NAN]),
                &cpu,
                Tolerance::Exact
            )
            .0
        );
        assert!(!compare(DType::BF16, &one_ulp, &cpu, Tolerance::Exact).0);
        assert!(compare(DType::BF16, &one_ulp, &cpu, Tolerance::Drift).0);
        assert!(!compare(DType::BF16, &far, &cpu, Tolerance::Drift).0);
        assert!(compare(DType::BF16, &far, &cpu, Tolerance::Coarse).0);
        // An unwritten bf16 output (0xFF bytes) is a NaN where the CPU has a number.
        assert!(!compare(DType::BF16, &[0xFF; 8], &cpu, Tolerance::Coarse).0);
    }

    #[test]
    fn the_bf16_gpt_mini_step_yields_bf16_kernels_with_every_tolerance() {
        let items = kernels_of(&Source::bf16_models(&["gpt-mini"]), false).unwrap();
        let bf16_io = |w: &Work| {
            let (i, o) = w.buffers();
            i.iter().chain(&o).any(|&(d, _)| d == DType::BF16)
        };
        let with_bf16 = items.iter().filter(|it| bf16_io(&it.work)).count();
        assert!(
            with_bf16 >= 10,
            "{with_bf16} of {} kernels move bf16",
            items.len()
        );
        let mut seen = std::collections::HashSet::new();
        for it in &items {
            if let Work::Fused(k) = &it.work {
                let t = tolerances(k);
                for (j, &t) in t.iter().enumerate() {
                    if k.output_dtype(j) == DType::BF16 {
                        seen.insert(format!("{t:?}"));
                    }
                }
            }
        }
        // Casts and products are exact; a softmax's rounded output drifts (expf). Arithmetic
        // inside a kernel is f32 (fuse::widen), so a drift is rounded once, at the store.
        for t in ["Exact", "Drift"] {
            assert!(seen.contains(t), "no bf16 output is {t}: {seen:?}");
        }
    }

    #[test]
    fn the_mlp_step_yields_distinct_fused_kernels_with_their_origins() {
        let items = kernels_of(&Source::models(&["mlp"]), false).unwrap();
        assert!(items.len() >= 5, "{} kernels", items.len());
        let mut names: Vec<String> = items.iter().map(|i| i.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), items.len(), "kernels are not distinct");
        assert!(items.iter().all(|i| i.origin.starts_with("mlp x")));
        // Every one has a CPU reference that runs on its random inputs.
        for it in &items {
            let ins = inputs_for(&it.work, 1, false);
            let outs = reference(&it.work, &ins).unwrap();
            assert_eq!(outs.len(), it.work.buffers().1.len());
        }
    }

    /// The dropout kernels generate, and their CPU reference is the CPU executor's dropout
    /// (the same draws, the same products) on random inputs.
    #[test]
    fn dropout_kernels_generate_and_their_reference_is_the_cpu_executors() {
        use ingot_compiler::ir::{Node, TensorType};
        use ingot_runtime::tensor::{Tensor, ViewMut};
        let items = kernels_of(&Source::Dropout, false).unwrap();
        assert_eq!(items.len(), 3 * 3 * 4 * 2, "every kernel distinct");
        for it in items.iter().filter(|it| it.work.buffers().0[0].1 == 4099) {
            let Work::Dropout { dtype, n, p, salt } = it.work else {
                panic!("not dropout")
            };
            let ins = inputs_for(&it.work, 3, false);
            let want = reference(&it.work, &ins).unwrap();
            let x = Tensor::from_le_bytes(TensorType::new([n], dtype), &ins[0]).unwrap();
            let seed = Tensor::from_le_bytes(
                TensorType::new(ingot_compiler::ir::Shape::scalar(), DType::I64),
                &ins[1],
            )
            .unwrap();
            let node = Node {
                op: Op::Dropout { p, salt },
                inputs: smallvec::smallvec![
                    ingot_compiler::ir::NodeId(0),
                    ingot_compiler::ir::NodeId(1)
                ],
                ty: TensorType::new([n], dtype),
            };
            let mut out = Tensor::zeros(TensorType::new([n], dtype));
            let out_view: ViewMut<'_> = out.view_mut();
            ingot_runtime::cpu::exec::exec_node(
                &node,
                &[x.view(), seed.view()],
                &[&x.ty, &seed.ty],
                out_view,
            )
            .unwrap();
            assert_eq!(out.to_le_bytes(), want[0], "{dtype} p {p}");
        }
    }

    #[test]
    fn random_sources_are_exact_kernels_that_check() {
        let items = kernels_of(&Source::Random(0..20), false).unwrap();
        assert!(items.len() >= 18, "{} distinct of 20", items.len());
        for it in &items {
            let Work::Fused(k) = &it.work else {
                panic!("not fused")
            };
            assert_eq!(k.check(), Ok(()));
        }
    }
}
