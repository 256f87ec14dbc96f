//! Operand values of the attention kernels' tests, as the kernels store them, and each
//! precision's tolerance. `#[path]`-included by the emulation test and the runtime's GPU test.

use super::reference::{uniform, Problem};
use ingot_kernels::cuda::attention::{AttentionPrecision, AttentionShape};
use ingot_kernels::dtype::{bf16, bf16_from_f64};

/// The f64 reference problem of `s`.
pub fn problem(s: &AttentionShape) -> Problem {
    Problem {
        bh: s.batch_heads,
        tq: s.seq_q,
        tk: s.seq_k,
        d: s.head_dim,
        causal: s.causal,
        scale: f64::from(s.scale),
    }
}

/// Q, K, V and the output's gradient of `prob` from `seed`, as the kernels see them (rounded to
/// the storage type of `p`).
pub fn inputs(p: AttentionPrecision, prob: &Problem, seed: u64) -> [Vec<f64>; 4] {
    let (nq, nk) = (prob.bh * prob.tq * prob.d, prob.bh * prob.tk * prob.d);
    let round = |xs: Vec<f64>| decode(p, &encode(p, &xs));
    [
        round(uniform(nq, seed, 2.0)),
        round(uniform(nk, seed + 1, 1.0)),
        round(uniform(nk, seed + 2, 1.0)),
        round(uniform(nq, seed + 3, 1.0)),
    ]
}

/// What the backward's preprocess kernel writes (delta): each query row's dot product of the
/// output and its gradient, `[bh·tq]`.
pub fn row_dots(prob: &Problem, out: &[f64], dout: &[f64]) -> Vec<f64> {
    (0..prob.bh * prob.tq)
        .map(|i| {
            (0..prob.d)
                .map(|c| out[i * prob.d + c] * dout[i * prob.d + c])
                .sum()
        })
        .collect()
}

/// Values as the kernels store them (f32, or bf16 rounded to nearest even), and back.
pub fn encode(p: AttentionPrecision, xs: &[f64]) -> Vec<u8> {
    match p {
        AttentionPrecision::Bf16 => xs
            .iter()
            .flat_map(|&x| bf16_from_f64(x).to_bits().to_ne_bytes())
            .collect(),
        _ => xs.iter().flat_map(|&x| (x as f32).to_ne_bytes()).collect(),
    }
}

/// The values `encode` stored in `b`.
pub fn decode(p: AttentionPrecision, b: &[u8]) -> Vec<f64> {
    match p {
        AttentionPrecision::Bf16 => b
            .chunks(2)
            .map(|c| bf16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f64())
            .collect(),
        _ => f32s(b),
    }
}

/// f32 values (the kernels' row statistics are f32 in every precision).
pub fn f32s(b: &[u8]) -> Vec<f64> {
    b.chunks(4)
        .map(|c| f64::from(f32::from_ne_bytes(c.try_into().unwrap())))
        .collect()
}

/// Tolerance of each precision, relative to the output's scale.
pub fn tolerance(p: AttentionPrecision) -> f64 {
    match p {
        AttentionPrecision::F32 => 1e-5,
        AttentionPrecision::Tf32 => 5e-3,
        AttentionPrecision::Bf16 => 2e-2,
    }
}
