//! `cnn`: a small MNIST-shaped convolutional network, as PyTorch users write it.
//!
//! - input x: `[128, 1, 28, 28]` f32, labels y: `[128]` i64 class ids in `0..10`
//! - `conv1` = Conv2d(1→32, 3, padding 1) → ReLU → MaxPool2d(2): `[128, 32, 14, 14]`
//! - `conv2` = Conv2d(32→64, 3, padding 1) → ReLU → MaxPool2d(2): `[128, 64, 7, 7]`
//! - flatten (`torch.flatten(x, 1)`, channel-major: `[128, 3136]`)
//! - `fc1` = Linear(3136→128) → ReLU → `fc2` = Linear(128→10)
//! - loss: mean softmax cross-entropy
//! - optimizer: SGD, lr 0.01, momentum 0.9 (buffers `{param}.momentum_buffer`), no weight decay
//! - 421,642 parameters: `conv1.weight` [32, 1, 3, 3], `conv1.bias` [32], `conv2.weight`
//!   [64, 32, 3, 3], `conv2.bias` [64], `fc1.weight` [128, 3136], `fc1.bias` [128],
//!   `fc2.weight` [10, 128], `fc2.bias` [10] (PyTorch's names for a module with attributes
//!   `conv1`, `conv2`, `fc1`, `fc2`, so a `state_dict` loads as is)
//! - default initialisation, as PyTorch's: every weight and bias uniform on `±1/√fan_in`
//!   (kaiming-uniform with `a = √5`; fan_in 9, 288, 3136 and 128), from the seeded generator

use super::{check_float, check_size, model_err, Model, Optimizer, Precision, ID_DTYPE};
use crate::error::Result;
use crate::ir::{DType, Graph};
use crate::trace::nn;

/// The reference batch size.
pub const CNN_BATCH: usize = 128;
/// Image side (MNIST's 28×28, one channel).
pub const CNN_SIDE: usize = 28;
/// Output classes.
pub const CNN_CLASSES: usize = 10;

/// The reference `cnn` in `dtype` (f32; f64 for gradient checks).
pub fn cnn(dtype: DType) -> Result<Model> {
    cnn_with(CNN_BATCH, dtype)
}

/// The `cnn` at another batch size (for small tests); the parameters are the same.
pub fn cnn_with(batch: usize, dtype: DType) -> Result<Model> {
    let name = if batch == CNN_BATCH {
        "cnn".to_string()
    } else {
        format!("cnn (batch {batch})")
    };
    check_float(&name, dtype)?;
    if batch == 0 {
        return Err(model_err(&name, "batch must be at least 1"));
    }
    check_size(&name, "batch", &[batch, 32, CNN_SIDE, CNN_SIDE])?;
    let mut g = Graph::new();
    let x = g.input("x", [batch, 1, CNN_SIDE, CNN_SIDE], dtype)?;
    let y = g.input("y", [batch], ID_DTYPE)?;
    let h = nn::conv2d(&mut g, "conv1", x, 1, 32, 3, 1, 1, 1, 1, true)?;
    let h = g.scoped("relu1", |g| nn::relu(g, h))?;
    let h = g.scoped("pool1", |g| nn::max_pool2d(g, h, 2, 2, 0))?;
    let h = nn::conv2d(&mut g, "conv2", h, 32, 64, 3, 1, 1, 1, 1, true)?;
    let h = g.scoped("relu2", |g| nn::relu(g, h))?;
    let h = g.scoped("pool2", |g| nn::max_pool2d(g, h, 2, 2, 0))?;
    let h = g.scoped("flatten", |g| nn::flatten(g, h))?;
    let side = CNN_SIDE / 4;
    let h = nn::linear_kaiming(&mut g, "fc1", h, 64 * side * side, 128, true)?;
    let h = g.scoped("relu3", |g| nn::relu(g, h))?;
    let logits = nn::linear_kaiming(&mut g, "fc2", h, 128, CNN_CLASSES, true)?;
    let loss = g.scoped("loss", |g| nn::softmax_cross_entropy(g, logits, y))?;
    g.set_output("loss", loss)?;
    Ok(Model {
        name,
        graph: g,
        eval_graph: None,
        optimizer: Optimizer::Momentum {
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 0.0,
        },
        precision: Precision::F32,
    })
}
