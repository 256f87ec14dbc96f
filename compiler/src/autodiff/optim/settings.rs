//! Which optimizer a model trains with and its hyperparameters, and their text forms (a model
//! file's `optimizer` line, the command line's flags). A model names its optimizer (the
//! `optimizer` field of `model::Model`); autodiff owns the type because it spells the update as
//! IR (the parent module, [`super`]).

use serde::{Deserialize, Serialize};

/// An optimizer and its hyperparameters (PyTorch's semantics).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Optimizer {
    /// Plain SGD without momentum: `p -= lr * g`.
    Sgd { lr: f64 },
    /// `torch.optim.SGD` with momentum and (L2, coupled) weight decay, dampening 0, not
    /// Nesterov: `g += wd * p; buf = momentum * buf + g; p -= lr * buf`, the buffer kept as
    /// state `{param}.momentum_buffer` (PyTorch's name). With momentum 0 there is no buffer.
    Momentum {
        lr: f64,
        momentum: f64,
        weight_decay: f64,
    },
    /// AdamW with decoupled weight decay and bias correction, as `torch.optim.AdamW`.
    AdamW {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
}

impl Optimizer {
    /// The same optimizer with learning rate `lr`.
    pub fn with_lr(self, lr: f64) -> Optimizer {
        match self {
            Optimizer::Sgd { .. } => Optimizer::Sgd { lr },
            Optimizer::Momentum {
                momentum,
                weight_decay,
                ..
            } => Optimizer::Momentum {
                lr,
                momentum,
                weight_decay,
            },
            Optimizer::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            } => Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            },
        }
    }

    /// `torch.optim.SGD` with `momentum` and `weight_decay` (dampening 0, not Nesterov).
    pub fn momentum(lr: f64, momentum: f64, weight_decay: f64) -> Optimizer {
        Optimizer::Momentum {
            lr,
            momentum,
            weight_decay,
        }
    }

    /// `torch.optim.AdamW`'s defaults but for the learning rate and weight decay given.
    pub fn adamw(lr: f64, weight_decay: f64) -> Optimizer {
        Optimizer::AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        }
    }
}

/// Which optimizer, by the name the command line and the IR text form use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerKind {
    Sgd,
    Momentum,
    AdamW,
}

impl OptimizerKind {
    pub fn parse(name: &str) -> Option<OptimizerKind> {
        match name {
            "sgd" => Some(OptimizerKind::Sgd),
            "momentum" => Some(OptimizerKind::Momentum),
            "adamw" => Some(OptimizerKind::AdamW),
            _ => None,
        }
    }
}

/// Settings that replace some of an optimizer's: what `--optimizer`, `--lr`, `--weight-decay`,
/// `--betas`, `--momentum` and `--eps` (or an `optimizer` line of an IR file) give.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OptimizerSettings {
    pub kind: Option<OptimizerKind>,
    pub lr: Option<f64>,
    pub weight_decay: Option<f64>,
    pub betas: Option<(f64, f64)>,
    pub momentum: Option<f64>,
    pub eps: Option<f64>,
}

impl OptimizerSettings {
    /// True when nothing is set: the optimizer stays as it is.
    pub fn is_empty(&self) -> bool {
        *self == OptimizerSettings::default()
    }

    /// Parses `NAME key=value ...` (the `optimizer` line of an IR file, after the word
    /// `optimizer`): e.g. `adamw lr=3e-4 betas=0.9,0.95 weight_decay=0.1`. The error names the
    /// part at fault.
    pub fn parse(text: &str) -> Result<OptimizerSettings, String> {
        let mut words = text.split_whitespace();
        let mut s = OptimizerSettings::default();
        let name = words
            .next()
            .ok_or("no optimizer named (sgd, momentum or adamw)")?;
        s.kind = Some(
            OptimizerKind::parse(name)
                .ok_or_else(|| format!("unknown optimizer {name:?} (sgd, momentum or adamw)"))?,
        );
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| format!("{w:?} is not key=value"))?;
            let num = |v: &str| -> Result<f64, String> {
                v.parse::<f64>()
                    .map_err(|_| format!("{k}={v}: {v:?} is not a number"))
            };
            match k {
                "lr" => s.lr = Some(num(v)?),
                "weight_decay" => s.weight_decay = Some(num(v)?),
                "momentum" => s.momentum = Some(num(v)?),
                "eps" => s.eps = Some(num(v)?),
                "betas" => s.betas = Some(parse_betas(v)?),
                _ => {
                    return Err(format!(
                        "unknown setting {k:?} (lr, weight_decay, betas, momentum, eps)"
                    ))
                }
            }
        }
        Ok(s)
    }

    /// `base` with these settings applied. A new kind starts from PyTorch's defaults for it
    /// (SGD: lr 0.1 as the reference mlp; momentum: 0.9; AdamW: lr 1e-3, betas 0.9, 0.999,
    /// eps 1e-8, weight decay 0.01), keeping `base`'s learning rate only when the kind is
    /// `base`'s. A setting the optimizer has no use for (betas for SGD), or a value out of
    /// range, is an error naming it.
    pub fn apply(&self, base: Optimizer) -> Result<Optimizer, String> {
        let kind = self.kind.unwrap_or(match base {
            Optimizer::Sgd { .. } => OptimizerKind::Sgd,
            Optimizer::Momentum { .. } => OptimizerKind::Momentum,
            Optimizer::AdamW { .. } => OptimizerKind::AdamW,
        });
        let same = |o: Optimizer| {
            if self.kind.is_none() || kind_of(base) == kind {
                Some(o)
            } else {
                None
            }
        };
        let base = same(base);
        let o = match kind {
            OptimizerKind::Sgd | OptimizerKind::Momentum => {
                if self.betas.is_some() || self.eps.is_some() {
                    return Err("--betas and --eps apply to adamw only".into());
                }
                let (lr0, m0, wd0) = match base {
                    Some(Optimizer::Sgd { lr }) => (lr, 0.0, 0.0),
                    Some(Optimizer::Momentum {
                        lr,
                        momentum,
                        weight_decay,
                    }) => (lr, momentum, weight_decay),
                    _ => (
                        0.1,
                        if kind == OptimizerKind::Momentum {
                            0.9
                        } else {
                            0.0
                        },
                        0.0,
                    ),
                };
                let lr = self.lr.unwrap_or(lr0);
                let momentum = self.momentum.unwrap_or(m0);
                let weight_decay = self.weight_decay.unwrap_or(wd0);
                if kind == OptimizerKind::Sgd && self.momentum.is_some_and(|m| m != 0.0) {
                    return Err("--momentum applies to --optimizer momentum (sgd has none)".into());
                }
                if momentum == 0.0 && weight_decay == 0.0 && kind == OptimizerKind::Sgd {
                    Optimizer::Sgd { lr }
                } else {
                    Optimizer::Momentum {
                        lr,
                        momentum,
                        weight_decay,
                    }
                }
            }
            OptimizerKind::AdamW => {
                if self.momentum.is_some() {
                    return Err(
                        "--momentum applies to --optimizer momentum; adamw has --betas".into(),
                    );
                }
                let (lr0, b10, b20, eps0, wd0) = match base {
                    Some(Optimizer::AdamW {
                        lr,
                        beta1,
                        beta2,
                        eps,
                        weight_decay,
                    }) => (lr, beta1, beta2, eps, weight_decay),
                    _ => (1e-3, 0.9, 0.999, 1e-8, 0.01),
                };
                let (beta1, beta2) = self.betas.unwrap_or((b10, b20));
                Optimizer::AdamW {
                    lr: self.lr.unwrap_or(lr0),
                    beta1,
                    beta2,
                    eps: self.eps.unwrap_or(eps0),
                    weight_decay: self.weight_decay.unwrap_or(wd0),
                }
            }
        };
        o.check()?;
        Ok(o)
    }
}

fn kind_of(o: Optimizer) -> OptimizerKind {
    match o {
        Optimizer::Sgd { .. } => OptimizerKind::Sgd,
        Optimizer::Momentum { .. } => OptimizerKind::Momentum,
        Optimizer::AdamW { .. } => OptimizerKind::AdamW,
    }
}

/// `B1,B2`, each in [0, 1).
pub fn parse_betas(v: &str) -> Result<(f64, f64), String> {
    let (a, b) = v
        .split_once(',')
        .ok_or_else(|| format!("betas {v:?}: give two numbers, B1,B2 (e.g. 0.9,0.95)"))?;
    let n = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| format!("betas {v:?}: {x:?} is not a number"))
    };
    Ok((n(a)?, n(b)?))
}

impl Optimizer {
    /// Checks the hyperparameters are in range (finite, lr > 0, betas and momentum in [0, 1),
    /// eps > 0, weight decay >= 0); the error names the one at fault.
    pub fn check(&self) -> Result<(), String> {
        let finite_pos = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number above 0, not {v}"))
            }
        };
        let unit = |name: &str, v: f64| {
            if (0.0..1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be in [0, 1), not {v}"))
            }
        };
        let wd = |v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "weight decay must be a finite number >= 0, not {v}"
                ))
            }
        };
        match *self {
            Optimizer::Sgd { lr } => finite_pos("lr", lr),
            Optimizer::Momentum {
                lr,
                momentum,
                weight_decay,
            } => {
                finite_pos("lr", lr)?;
                unit("momentum", momentum)?;
                wd(weight_decay)
            }
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                finite_pos("lr", lr)?;
                unit("beta1", beta1)?;
                unit("beta2", beta2)?;
                finite_pos("eps", eps)?;
                wd(weight_decay)
            }
        }
    }
}

impl std::fmt::Display for Optimizer {
    /// The `optimizer` line's syntax: `adamw lr=0.0003 betas=0.9,0.95 eps=1e-8 weight_decay=0.1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Optimizer::Sgd { lr } => write!(f, "sgd lr={lr}"),
            Optimizer::Momentum {
                lr,
                momentum,
                weight_decay,
            } => write!(
                f,
                "momentum lr={lr} momentum={momentum} weight_decay={weight_decay}"
            ),
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => write!(
                f,
                "adamw lr={lr} betas={beta1},{beta2} eps={eps:e} weight_decay={weight_decay}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_optimizer_line_round_trips_through_its_display() {
        for o in [
            Optimizer::Sgd { lr: 0.1 },
            Optimizer::Momentum {
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 1e-4,
            },
            Optimizer::AdamW {
                lr: 3e-4,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
            },
        ] {
            let text = o.to_string();
            let s = OptimizerSettings::parse(&text).unwrap();
            assert_eq!(s.apply(Optimizer::Sgd { lr: 9.0 }).unwrap(), o, "{text}");
        }
    }

    #[test]
    fn settings_keep_the_models_optimizer_unless_a_kind_is_named() {
        let gpt = Optimizer::AdamW {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let lr = OptimizerSettings {
            lr: Some(1e-2),
            ..Default::default()
        };
        assert_eq!(lr.apply(gpt).unwrap(), gpt.with_lr(1e-2));
        assert_eq!(OptimizerSettings::default().apply(gpt).unwrap(), gpt);
        let sgd = OptimizerSettings {
            kind: Some(OptimizerKind::Sgd),
            ..Default::default()
        };
        assert_eq!(sgd.apply(gpt).unwrap(), Optimizer::Sgd { lr: 0.1 });
        let adamw = OptimizerSettings {
            kind: Some(OptimizerKind::AdamW),
            betas: Some((0.8, 0.9)),
            ..Default::default()
        };
        assert_eq!(
            adamw.apply(Optimizer::Sgd { lr: 0.1 }).unwrap(),
            Optimizer::AdamW {
                lr: 1e-3,
                beta1: 0.8,
                beta2: 0.9,
                eps: 1e-8,
                weight_decay: 0.01
            }
        );
    }

    #[test]
    fn a_setting_out_of_range_or_for_another_optimizer_is_an_error_naming_it() {
        let sgd = Optimizer::Sgd { lr: 0.1 };
        let bad = |s: OptimizerSettings, word: &str| {
            let e = s.apply(sgd).unwrap_err();
            assert!(e.contains(word), "{e}");
        };
        bad(
            OptimizerSettings {
                betas: Some((0.9, 0.99)),
                ..Default::default()
            },
            "betas",
        );
        bad(
            OptimizerSettings {
                lr: Some(-1.0),
                ..Default::default()
            },
            "lr",
        );
        bad(
            OptimizerSettings {
                kind: Some(OptimizerKind::AdamW),
                betas: Some((1.0, 0.9)),
                ..Default::default()
            },
            "beta1",
        );
        assert!(OptimizerSettings::parse("adam lr=1")
            .unwrap_err()
            .contains("adam"));
        assert!(OptimizerSettings::parse("sgd lr=x")
            .unwrap_err()
            .contains("lr=x"));
        assert!(OptimizerSettings::parse("sgd mu=1")
            .unwrap_err()
            .contains("mu"));
    }
}
