//! `cnn`: a small MNIST-shaped convolutional network, as PyTorch users write it, at any batch,
//! class count and image side (`cnn:batch=..,classes=..,side=..`, [`CnnConfig`]).
//!
//! - input x: `[batch, 1, side, side]` f32, labels y: `[batch]` i64 class ids in `0..classes`
//! - `conv1` = Conv2d(1→32, 3, padding 1) → ReLU → MaxPool2d(2): `[batch, 32, side/2, side/2]`
//! - `conv2` = Conv2d(32→64, 3, padding 1) → ReLU → MaxPool2d(2): `[batch, 64, s, s]` with
//!   `s = ⌊⌊side/2⌋/2⌋` (PyTorch's pooling floors)
//! - flatten (`torch.flatten(x, 1)`, channel-major: `[batch, 64·s²]`)
//! - `fc1` = Linear(64·s²→128) → ReLU → `fc2` = Linear(128→classes)
//! - loss: mean softmax cross-entropy
//! - optimizer: SGD, lr 0.01, momentum 0.9 (buffers `{param}.momentum_buffer`), no weight decay
//! - the reference `cnn` (batch 128, 10 classes, 28×28) has 421,642 parameters:
//!   `conv1.weight` [32, 1, 3, 3], `conv1.bias` [32], `conv2.weight` [64, 32, 3, 3],
//!   `conv2.bias` [64], `fc1.weight` [128, 3136], `fc1.bias` [128], `fc2.weight` [10, 128],
//!   `fc2.bias` [10] (PyTorch's names for a module with attributes `conv1`, `conv2`, `fc1`,
//!   `fc2`, so a `state_dict` loads as is)
//! - default initialisation, as PyTorch's: every weight and bias uniform on `±1/√fan_in`
//!   (kaiming-uniform with `a = √5`; fan_in 9, 288, 64·s² and 128), from the seeded generator

use super::check::{check_float, check_size, model_err};
use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::error::Result;
use ingot_compiler::ir::{DType, Graph};
use ingot_compiler::model::Model;
use ingot_compiler::model::ID_DTYPE;
use ingot_compiler::trace::nn;
use std::fmt;

/// The reference batch size.
pub const CNN_BATCH: usize = 128;
/// Image side (MNIST's 28×28, one channel).
pub const CNN_SIDE: usize = 28;
/// Output classes.
pub const CNN_CLASSES: usize = 10;

/// The `cnn`'s shape: the `cnn:` spec's keys. [`fmt::Display`] writes the spec's body
/// (`batch=64,classes=10,side=28`), which the spec parser reads back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CnnConfig {
    pub batch: usize,
    pub classes: usize,
    /// The images' height and width (at least 4: two poolings halve it).
    pub side: usize,
}

impl CnnConfig {
    /// The spec's keys, in the order [`fmt::Display`] writes them.
    pub const KEYS: [&'static str; 3] = ["batch", "classes", "side"];
    /// The reference `cnn`: MNIST's shape at batch 128.
    pub const DEFAULTS: CnnConfig = CnnConfig {
        batch: CNN_BATCH,
        classes: CNN_CLASSES,
        side: CNN_SIDE,
    };

    /// The side of `conv2`'s pooled output (each MaxPool2d(2) floors a side s to ⌊s/2⌋).
    pub fn final_side(&self) -> usize {
        self.side / 4
    }

    /// The name a model of this shape goes by: `cnn` for the reference shape, else its full
    /// spec, so that `cnn:batch=64` and `cnn --batch 64` name the same model (checkpoints
    /// compare names).
    pub fn name(&self) -> String {
        if *self == CnnConfig::DEFAULTS {
            "cnn".to_string()
        } else {
            format!("cnn:{self}")
        }
    }

    /// Checks the shape, naming the key at fault (as `spec`'s error): a zero, a side under 4
    /// (two poolings would leave nothing), or sizes whose bytes overflow.
    pub fn validate(&self, spec: &str) -> Result<()> {
        for (k, v) in [
            ("batch", self.batch),
            ("classes", self.classes),
            ("side", self.side),
        ] {
            if v == 0 {
                return Err(model_err(spec, format!("key {k:?} must be at least 1")));
            }
        }
        if self.side < 4 {
            return Err(model_err(
                spec,
                format!(
                    "key \"side\": {} is too small: two 2x2 poolings halve the image twice, so the side must be at least 4",
                    self.side
                ),
            ));
        }
        check_size(spec, "batch", &[self.batch, 32, self.side, self.side])?;
        let s = self.final_side();
        check_size(spec, "side", &[64, s, s, 128])?;
        check_size(spec, "classes", &[self.classes, 128])?;
        Ok(())
    }
}

impl fmt::Display for CnnConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "batch={},classes={},side={}",
            self.batch, self.classes, self.side
        )
    }
}

/// The reference `cnn` in `dtype` (f32; f64 for gradient checks).
pub fn cnn(dtype: DType) -> Result<Model> {
    cnn_of(&CnnConfig::DEFAULTS, dtype)
}

/// The `cnn` at another batch size (for small tests); the parameters are the same.
pub fn cnn_with(batch: usize, dtype: DType) -> Result<Model> {
    cnn_of(
        &CnnConfig {
            batch,
            ..CnnConfig::DEFAULTS
        },
        dtype,
    )
}

/// The `cnn` `cfg` shapes, named by [`CnnConfig::name`], in `dtype`.
pub fn cnn_of(cfg: &CnnConfig, dtype: DType) -> Result<Model> {
    let name = cfg.name();
    check_float(&name, dtype)?;
    cfg.validate(&name)?;
    let CnnConfig {
        batch,
        classes,
        side,
    } = *cfg;
    let mut g = Graph::new();
    let x = g.input("x", [batch, 1, side, side], dtype)?;
    let y = g.input("y", [batch], ID_DTYPE)?;
    let h = nn::conv2d(&mut g, "conv1", x, 1, 32, 3, 1, 1, 1, 1, true)?;
    let h = g.scoped("relu1", |g| nn::relu(g, h))?;
    let h = g.scoped("pool1", |g| nn::max_pool2d(g, h, 2, 2, 0))?;
    let h = nn::conv2d(&mut g, "conv2", h, 32, 64, 3, 1, 1, 1, 1, true)?;
    let h = g.scoped("relu2", |g| nn::relu(g, h))?;
    let h = g.scoped("pool2", |g| nn::max_pool2d(g, h, 2, 2, 0))?;
    let h = g.scoped("flatten", |g| nn::flatten(g, h))?;
    let s = cfg.final_side();
    let h = nn::linear_kaiming(&mut g, "fc1", h, 64 * s * s, 128, true)?;
    let h = g.scoped("relu3", |g| nn::relu(g, h))?;
    let logits = nn::linear_kaiming(&mut g, "fc2", h, 128, classes, true)?;
    let loss = g.scoped("loss", |g| nn::softmax_cross_entropy(g, logits, y))?;
    g.set_output("loss", loss)?;
    Ok(Model::new(name, g, Optimizer::momentum(0.01, 0.9, 0.0)))
}
