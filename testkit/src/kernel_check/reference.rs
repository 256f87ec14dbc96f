//! CPU references and the comparison of the GPU's outputs with them.

use super::work::{Res, Work};
use ingot_kernels::fused::{cpu, FusedKernel, Inst};
use ingot_kernels::{BinaryOp, DType, UnaryOp};

pub(super) fn reference(work: &Work, inputs: &[Vec<u8>]) -> Res<Vec<Vec<u8>>> {
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
        Work::Scatter { op, .. } => {
            let (ids, values, rows, row_len, n) = (op.ids, op.values, op.rows, op.row_len, op.n);
            let s = values.size();
            if values == DType::BF16 {
                let sums = scatter_bf16(ids, inputs, rows, row_len, n);
                return Ok(vec![match op.out {
                    DType::F32 => sums.iter().flat_map(|x| x.to_ne_bytes()).collect(),
                    _ => sums
                        .iter()
                        .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_ne_bytes())
                        .collect(),
                }]);
            }
            let mut out = vec![0u8; rows * row_len * s];
            for r in 0..n {
                let id = read_int(ids, &inputs[0], r);
                if id < 0 || id as u64 >= rows as u64 {
                    continue;
                }
                for c in 0..row_len {
                    let (o, v) = ((id as usize * row_len + c) * s, (r * row_len + c) * s);
                    add_into(values, &mut out[o..o + s], &inputs[1][v..v + s]);
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
pub(super) fn scatter_bf16(
    ids: DType,
    inputs: &[Vec<u8>],
    rows: usize,
    row_len: usize,
    n: usize,
) -> Vec<f32> {
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

pub(super) fn read_int(dt: DType, b: &[u8], i: usize) -> i64 {
    match dt {
        DType::I32 => i32::from_ne_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as i64,
        _ => i64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()),
    }
}

pub(super) fn add_into(dt: DType, acc: &mut [u8], v: &[u8]) {
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
    pub(super) fn bound(self, dt: DType) -> f64 {
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
pub(super) fn compare(dt: DType, gpu: &[u8], cpu: &[u8], tol: Tolerance) -> (bool, f64, String) {
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
            exact_verdict(&bad, g.len(), "bf16 values ", |i| {
                format!("gpu {} cpu {}", g[i], c[i])
            })
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
            exact_verdict(&bad, gpu.len() / s, "", |i| {
                let (g, c) = (&gpu[i * s..(i + 1) * s], &cpu[i * s..(i + 1) * s]);
                format!("gpu {g:?} cpu {c:?}")
            })
        }
    }
}

/// The verdict of an exact comparison of `total` values (`kind` names them, with a trailing
/// space, or is empty) of which those at `bad` differ: `show(i)` gives both sides' value `i`.
fn exact_verdict(
    bad: &[usize],
    total: usize,
    kind: &str,
    show: impl Fn(usize) -> String,
) -> (bool, f64, String) {
    match bad.first() {
        None => (true, 0.0, "exact".into()),
        Some(&i) => (
            false,
            f64::INFINITY,
            format!(
                "{} of {total} {kind}differ, first at {i} ({})",
                bad.len(),
                show(i)
            ),
        ),
    }
}
