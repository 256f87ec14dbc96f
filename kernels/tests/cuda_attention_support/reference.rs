//! The plain-loop f64 reference of fused attention, forward and backward (the analytic
//! gradients), and the seeded inputs and error measure the attention kernel tests share
//! (kernels/tests/cuda_attention_emu.rs on the host, runtime/tests/cuda_attention.rs on the GPU).

#![allow(dead_code)]

/// One problem: `bh` independent heads of `tq` queries and `tk` keys of width `d`.
#[derive(Clone, Copy, Debug)]
pub struct Problem {
    pub bh: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub causal: bool,
    pub scale: f64,
}

impl Problem {
    fn visible(&self, i: usize, j: usize) -> bool {
        !self.causal || j <= i
    }

    /// Probabilities of head `h`, row `i` (0 where hidden), and the row's log-sum-exp.
    fn row(&self, q: &[f64], k: &[f64], h: usize, i: usize) -> (Vec<f64>, f64) {
        let (d, tq, tk) = (self.d, self.tq, self.tk);
        let qi = &q[(h * tq + i) * d..][..d];
        let s: Vec<f64> = (0..tk)
            .map(|j| {
                if !self.visible(i, j) {
                    return f64::NEG_INFINITY;
                }
                let kj = &k[(h * tk + j) * d..][..d];
                self.scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
        let p = s.iter().map(|x| (x - m).exp() / sum).collect();
        (p, m + sum.ln())
    }

    /// `(out, lse)`.
    pub fn forward(&self, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (d, tq, tk) = (self.d, self.tq, self.tk);
        let mut out = vec![0.0; self.bh * tq * d];
        let mut lse = vec![0.0; self.bh * tq];
        for h in 0..self.bh {
            for i in 0..tq {
                let (p, l) = self.row(q, k, h, i);
                lse[h * tq + i] = l;
                for (j, pj) in p.iter().enumerate() {
                    for c in 0..d {
                        out[(h * tq + i) * d + c] += pj * v[(h * tk + j) * d + c];
                    }
                }
            }
        }
        (out, lse)
    }

    /// `(dq, dk, dv)` of `sum(out · dout)`, and the magnitude of the terms `dq` and `dk` sum:
    /// `scale · max_i Σ_j p_ij (|dp_ij| + |delta_i|) · max(|q|, |k|)`. `ds = p (dp - delta)`
    /// cancels (exactly, with one visible key), so `dq` and `dk` can be far smaller than the
    /// rounding of the terms that make them; their errors are measured against this.
    pub fn backward(
        &self,
        q: &[f64],
        k: &[f64],
        v: &[f64],
        dout: &[f64],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, f64) {
        let (d, tq, tk) = (self.d, self.tq, self.tk);
        let mut dq = vec![0.0; self.bh * tq * d];
        let mut dk = vec![0.0; self.bh * tk * d];
        let mut dv = vec![0.0; self.bh * tk * d];
        let mut terms = 0f64;
        for h in 0..self.bh {
            for i in 0..tq {
                let (p, _) = self.row(q, k, h, i);
                let doi = &dout[(h * tq + i) * d..][..d];
                let dp: Vec<f64> = (0..tk)
                    .map(|j| {
                        let vj = &v[(h * tk + j) * d..][..d];
                        doi.iter().zip(vj).map(|(a, b)| a * b).sum()
                    })
                    .collect();
                let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                terms = terms.max(
                    p.iter()
                        .zip(&dp)
                        .map(|(a, b)| a * (b.abs() + delta.abs()))
                        .sum(),
                );
                for j in 0..tk {
                    let ds = p[j] * (dp[j] - delta);
                    for c in 0..d {
                        dq[(h * tq + i) * d + c] += self.scale * ds * k[(h * tk + j) * d + c];
                        dk[(h * tk + j) * d + c] += self.scale * ds * q[(h * tq + i) * d + c];
                        dv[(h * tk + j) * d + c] += p[j] * doi[c];
                    }
                }
            }
        }
        let qk = q.iter().chain(k).fold(0f64, |m, x| m.max(x.abs()));
        (dq, dk, dv, self.scale * terms * qk)
    }
}

/// `n` values uniform in `[-amp, amp)` from a seeded generator (splitmix64).
pub fn uniform(n: usize, seed: u64, amp: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
        })
        .collect()
}

/// `max |got - want| / max(max |want|, floor)`: the error relative to the output's scale.
pub fn relative_error(got: &[f64], want: &[f64], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(floor, |m, x| m.max(x.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() {
                f64::INFINITY
            } else {
                (g - w).abs()
            }
        })
        .fold(0.0, f64::max)
        / scale
}
