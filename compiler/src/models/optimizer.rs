//! Which optimizer a model trains with and its hyperparameters: part of the model's
//! description, so it lives with the models; autodiff spells its update as IR
//! (`autodiff::optim`).

use serde::{Deserialize, Serialize};

/// An optimizer and its hyperparameters (PyTorch's semantics).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Optimizer {
    /// Plain SGD without momentum: `p -= lr * g`.
    Sgd { lr: f64 },
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
