//! `resnet18`: torchvision's `resnet18(num_classes=10)` at CIFAR-10's shape, with torchvision's
//! parameter names, so a `state_dict` saved from PyTorch loads as is.
//!
//! - input x: `[128, 3, 32, 32]` f32, labels y: `[128]` i64 class ids in `0..10`
//! - stem: `conv1` = Conv2d(3→64, 7, stride 2, padding 3, no bias) → `bn1` → ReLU →
//!   MaxPool2d(3, stride 2, padding 1): `[128, 64, 8, 8]`
//! - `layer1`..`layer4`: two BasicBlocks each, 64, 128, 256, 512 channels, the first block of
//!   layers 2–4 with stride 2 and a `downsample` (Conv2d 1×1 stride 2, no bias, then
//!   BatchNorm2d): `[128, 512, 1, 1]` after `layer4`. A BasicBlock is
//!   `relu(bn2(conv2(relu(bn1(conv1(x))))) + identity)`, its convs 3×3 with padding 1, no bias.
//! - adaptive average pool to 1×1, flatten, `fc` = Linear(512→10)
//! - loss: mean softmax cross-entropy
//! - optimizer: SGD, lr 0.1, momentum 0.9, weight decay 5e-4 (coupled, as `torch.optim.SGD`)
//! - 11,181,642 parameters: `conv1.weight` [64, 3, 7, 7], `bn1.{weight,bias}` [64],
//!   `layer{l}.{b}.conv{1,2}.weight`, `layer{l}.{b}.bn{1,2}.{weight,bias}`,
//!   `layer{l}.0.downsample.0.weight` [out, in, 1, 1] and `layer{l}.0.downsample.1.{weight,bias}`
//!   for l in 2..4, `fc.weight` [10, 512], `fc.bias` [10]
//! - resident state besides the parameters: every batch norm's `running_mean` and
//!   `running_var` (momentum 0.1, eps 1e-5), updated by the step in training mode; the
//!   evaluation step (traced in [`crate::ir::Mode::Eval`], [`Model::eval_graph`]) normalises
//!   by them and leaves them as they are.
//!   (torchvision also keeps `num_batches_tracked`, which momentum 0.1 never reads; it is not
//!   a leaf here.)
//! - default initialisation, as torchvision's: conv weights normal(0, √(2 / fan_out)) with
//!   fan_out = out·k² (kaiming-normal, `mode="fan_out"`), batch norm gain one and bias zero,
//!   `fc` PyTorch's Linear default (uniform on ±1/√512), running statistics zero and one.

use super::{check_float, check_size, model_err, Model, Optimizer, Precision, ID_DTYPE};
use crate::error::Result;
use crate::ir::{DType, Graph, Init, NodeId};
use crate::trace::nn;

/// The reference batch size.
pub const RESNET_BATCH: usize = 128;
/// Image side (CIFAR-10's 32×32, three channels).
pub const RESNET_SIDE: usize = 32;
/// Output classes.
pub const RESNET_CLASSES: usize = 10;
/// Batch norm's epsilon (PyTorch's default).
pub const BN_EPS: f64 = 1e-5;

/// The reference `resnet18` in `dtype`.
pub fn resnet18(dtype: DType) -> Result<Model> {
    resnet18_with(RESNET_BATCH, dtype)
}

/// A conv without bias, kaiming-normal (fan_out) initialised, as torchvision's ResNets have.
fn conv(
    g: &mut Graph,
    name: &str,
    x: NodeId,
    in_ch: usize,
    out_ch: usize,
    kernel: usize,
    stride: usize,
) -> Result<NodeId> {
    let std = (2.0 / (out_ch * kernel * kernel) as f64).sqrt();
    nn::conv2d_with_init(
        g,
        name,
        x,
        [in_ch, out_ch, kernel, stride, kernel / 2, 1, 1],
        false,
        Init::Normal { std },
    )
}

/// torchvision's `BasicBlock` named `name`, from `in_ch` to `out_ch` channels.
fn basic_block(
    g: &mut Graph,
    name: &str,
    x: NodeId,
    in_ch: usize,
    out_ch: usize,
    stride: usize,
) -> Result<NodeId> {
    let h = conv(g, &format!("{name}.conv1"), x, in_ch, out_ch, 3, stride)?;
    let h = nn::batch_norm2d(g, &format!("{name}.bn1"), h, BN_EPS)?;
    let h = g.scoped(&format!("{name}.relu"), |g| nn::relu(g, h))?;
    let h = conv(g, &format!("{name}.conv2"), h, out_ch, out_ch, 3, 1)?;
    let h = nn::batch_norm2d(g, &format!("{name}.bn2"), h, BN_EPS)?;
    let identity = if stride != 1 || in_ch != out_ch {
        let d = conv(
            g,
            &format!("{name}.downsample.0"),
            x,
            in_ch,
            out_ch,
            1,
            stride,
        )?;
        nn::batch_norm2d(g, &format!("{name}.downsample.1"), d, BN_EPS)?
    } else {
        x
    };
    // torchvision's BasicBlock names its one ReLU module `relu` (applied twice).
    g.scoped(&format!("{name}.relu"), |g| {
        let h = g.add(h, identity)?;
        nn::relu(g, h)
    })
}

/// The `resnet18` at another batch size (for small tests); the parameters are the same.
pub fn resnet18_with(batch: usize, dtype: DType) -> Result<Model> {
    let name = if batch == RESNET_BATCH {
        "resnet18".to_string()
    } else {
        format!("resnet18 (batch {batch})")
    };
    check_float(&name, dtype)?;
    if batch < 2 {
        // Batch norm's running variance divides by n − 1 over (N, H, W), and layer4 is 1×1.
        return Err(model_err(&name, "batch must be at least 2 (batch norm)"));
    }
    check_size(&name, "batch", &[batch, 64, RESNET_SIDE, RESNET_SIDE])?;
    let (graph, eval_graph) = Model::trace_modes(&name, |g| {
        let x = g.input("x", [batch, 3, RESNET_SIDE, RESNET_SIDE], dtype)?;
        let y = g.input("y", [batch], ID_DTYPE)?;
        let h = conv(g, "conv1", x, 3, 64, 7, 2)?;
        let h = nn::batch_norm2d(g, "bn1", h, BN_EPS)?;
        let h = g.scoped("relu", |g| nn::relu(g, h))?;
        let mut h = g.scoped("maxpool", |g| nn::max_pool2d(g, h, 3, 2, 1))?;
        let mut ch = 64;
        for (l, out) in [64, 128, 256, 512].into_iter().enumerate() {
            let stride = if l == 0 { 1 } else { 2 };
            h = basic_block(g, &format!("layer{}.0", l + 1), h, ch, out, stride)?;
            h = basic_block(g, &format!("layer{}.1", l + 1), h, out, out, 1)?;
            ch = out;
        }
        let h = g.scoped("avgpool", |g| {
            let h = nn::global_avg_pool(g, h)?;
            nn::flatten(g, h)
        })?;
        let logits = nn::linear_kaiming(g, "fc", h, 512, RESNET_CLASSES, true)?;
        let loss = g.scoped("loss", |g| nn::softmax_cross_entropy(g, logits, y))?;
        g.set_output("loss", loss)?;
        Ok(())
    })?;
    Ok(Model {
        name,
        graph,
        eval_graph,
        optimizer: Optimizer::Momentum {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 5e-4,
        },
        precision: Precision::F32,
    })
}
