//! Learning-rate schedules, as the factor the step's `lr_scale` input multiplies the
//! optimizer's learning rate by (PyTorch's `LambdaLR` semantics): the host computes it before
//! each step and writes it into the input's slot, so one compiled step serves the whole run.

/// The shape of the decay after the warmup.
/// The command line names its values (`--schedule constant|cosine|linear`) with an enum of its
/// own, so this crate does not depend on an argument parser.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// The optimizer's learning rate throughout (after any warmup).
    #[default]
    Constant,
    /// Half a cosine from the full rate down to the minimum at the last step (nanoGPT's).
    Cosine,
    /// A straight line from the full rate down to the minimum at the last step.
    Linear,
}

/// A schedule: linear warmup over `warmup` steps, then `decay` to `min_ratio` by step `total`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    pub decay: Decay,
    pub warmup: u64,
    /// The run's last step (decay ends there).
    pub total: u64,
    /// The minimum, as a fraction of the optimizer's learning rate.
    pub min_ratio: f64,
}

impl Schedule {
    /// Whether the learning rate ever differs from the optimizer's.
    pub fn is_constant(&self) -> bool {
        self.decay == Decay::Constant && self.warmup == 0
    }

    /// The factor for the step run after `done` steps (0-based, as nanoGPT's `get_lr(it)`):
    /// `(it + 1) / (warmup + 1)` during the warmup, then the decay from 1 to `min_ratio` over
    /// the remaining steps, `min_ratio` past `total`.
    pub fn factor(&self, done: u64) -> f64 {
        if done < self.warmup {
            // In f64: `warmup + 1` in integers wraps to 0 at u64::MAX (an infinite rate).
            return (done as f64 + 1.0) / (self.warmup as f64 + 1.0);
        }
        let span = self.total.saturating_sub(self.warmup).saturating_sub(1);
        let t = if span == 0 {
            1.0
        } else {
            ((done - self.warmup) as f64 / span as f64).min(1.0)
        };
        let m = self.min_ratio;
        match self.decay {
            Decay::Constant => 1.0,
            Decay::Cosine => m + (1.0 - m) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()),
            Decay::Linear => m + (1.0 - m) * (1.0 - t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(decay: Decay, warmup: u64, total: u64, min_ratio: f64) -> Schedule {
        Schedule {
            decay,
            warmup,
            total,
            min_ratio,
        }
    }

    #[test]
    fn a_warmup_as_long_as_u64_allows_keeps_the_rate_finite_and_tiny() {
        let s = schedule(Decay::Constant, u64::MAX, 10, 0.0);
        for done in [0, 1, 9] {
            let f = s.factor(done);
            assert!(f.is_finite() && f > 0.0 && f < 1e-15, "step {done}: {f}");
        }
    }

    #[test]
    fn warmup_rises_linearly_then_cosine_decays_to_the_minimum_at_the_last_step() {
        let s = schedule(Decay::Cosine, 4, 14, 0.1);
        assert_eq!(s.factor(0), 0.2);
        assert_eq!(s.factor(3), 0.8);
        assert_eq!(
            s.factor(4),
            1.0,
            "the first step after warmup runs at the full rate"
        );
        assert!(
            (s.factor(13) - 0.1).abs() < 1e-12,
            "the last step at the minimum"
        );
        let mid = s.factor(4 + 9 / 2);
        assert!(mid < 1.0 && mid > 0.1);
        for i in 4..13 {
            assert!(s.factor(i + 1) <= s.factor(i), "falls monotonically");
        }
        assert!(
            (s.factor(100) - 0.1).abs() < 1e-12,
            "the minimum past the end"
        );
        let l = schedule(Decay::Linear, 0, 11, 0.0);
        assert_eq!(l.factor(0), 1.0);
        assert!((l.factor(5) - 0.5).abs() < 1e-12);
        assert_eq!(l.factor(10), 0.0);
        let c = schedule(Decay::Constant, 0, 5, 0.0);
        assert!(c.is_constant() && c.factor(3) == 1.0);
    }
}
