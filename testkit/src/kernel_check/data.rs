//! Seeded input data for a work item.

use super::work::Work;
use ingot_kernels::fused::{FusedKernel, Inst};
use ingot_kernels::{BinaryOp, DType, UnaryOp};

pub(super) struct XorShift(u64);

impl XorShift {
    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [0, 1).
    pub(super) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// How to fill a buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Fill {
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

pub(super) fn fill(dtype: DType, len: usize, how: Fill, seed: u64) -> Vec<u8> {
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
pub(super) fn positive_inputs(k: &FusedKernel) -> Vec<bool> {
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

pub(super) fn inputs_for(work: &Work, seed: u64, exact: bool) -> Vec<Vec<u8>> {
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
                Work::Scatter { op, skewed: true } if i == 0 => Fill::IdsSkewed(op.rows as u64),
                Work::Scatter { op, .. } if i == 0 => Fill::IdsAround(op.rows as u64),
                _ if pos[i] => Fill::Positive,
                _ => Fill::Signed,
            };
            fill(dt, len, how, seed.wrapping_add(i as u64 * 7919))
        })
        .collect()
}
