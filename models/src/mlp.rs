//! `mlp`: Linear(784→1024) → ReLU → Linear(1024→1024) → ReLU → Linear(1024→10), mean softmax
//! cross-entropy, SGD lr 0.1 without momentum. 1,863,690 parameters.

use super::check::{check_float, check_size, model_err};
use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::error::Result;
use ingot_compiler::ir::DType;
use ingot_compiler::ir::Graph;
use ingot_compiler::model::Model;
use ingot_compiler::model::ID_DTYPE;
use ingot_compiler::trace::nn;

/// The reference batch size.
pub const MLP_BATCH: usize = 256;
/// Input features (a flattened 28×28 image).
pub const MLP_IN: usize = 784;
/// Width of both hidden layers.
pub const MLP_HIDDEN: usize = 1024;
/// Output classes.
pub const MLP_CLASSES: usize = 10;

/// The reference `mlp`: `x [256, 784]` of `dtype`, `y [256]` i64 class ids in `0..10`.
pub fn mlp(dtype: DType) -> Result<Model> {
    mlp_with(MLP_BATCH, dtype)
}

/// The `mlp` at another batch size (for small tests); the parameters are the same.
pub fn mlp_with(batch: usize, dtype: DType) -> Result<Model> {
    let name = if batch == MLP_BATCH {
        "mlp".to_string()
    } else {
        format!("mlp (batch {batch})")
    };
    check_float(&name, dtype)?;
    if batch == 0 {
        return Err(model_err(&name, "batch must be at least 1"));
    }
    check_size(&name, "batch", &[batch, MLP_HIDDEN])?;
    let mut g = Graph::new();
    let x = g.input("x", [batch, MLP_IN], dtype)?;
    let y = g.input("y", [batch], ID_DTYPE)?;
    let h = nn::linear(&mut g, "fc1", x, MLP_IN, MLP_HIDDEN, true)?;
    let h = g.scoped("relu1", |g| nn::relu(g, h))?;
    let h = nn::linear(&mut g, "fc2", h, MLP_HIDDEN, MLP_HIDDEN, true)?;
    let h = g.scoped("relu2", |g| nn::relu(g, h))?;
    let logits = nn::linear(&mut g, "fc3", h, MLP_HIDDEN, MLP_CLASSES, true)?;
    let loss = g.scoped("loss", |g| nn::softmax_cross_entropy(g, logits, y))?;
    g.set_output("loss", loss)?;
    Ok(Model::new(name, g, Optimizer::Sgd { lr: 0.1 }))
}
