//! The ResNet family with torchvision's architecture and parameter names, so that a
//! `state_dict` saved from PyTorch loads as is and one Ingot saves loads into torchvision.
//!
//! - [`resnet`], for `resnet:depth=18|34|50|101|152,side=N,batch=N,classes=N,width=N`
//!   ([`ResNetConfig`]), torchvision's `resnet{depth}(num_classes=classes)` on `side`×`side`
//!   images; `width` is the channel count of the stem and of `layer1` (torchvision's 64), the
//!   later layers doubling it, as a narrow model for tests.
//! - `resnet18`: the CIFAR-10-shaped reference, `resnet:depth=18,side=32,batch=128,classes=10`
//!   under its own name (the same graph, byte for byte).
//!
//! The architecture (torchvision v1.5):
//! - input x: `[batch, 3, side, side]` f32, labels y: `[batch]` i64 class ids in `0..classes`
//! - stem: `conv1` = Conv2d(3→w, 7, stride 2, padding 3, no bias) → `bn1` → ReLU →
//!   MaxPool2d(3, stride 2, padding 1), at every side (torchvision has no CIFAR stem)
//! - `layer1`..`layer4` of `w`, `2w`, `4w`, `8w` planes; blocks per layer 2,2,2,2 (18),
//!   3,4,6,3 (34 and 50), 3,4,23,3 (101), 3,8,36,3 (152). The first block of layers 2–4 has
//!   stride 2, and a block whose stride or channel count changes has a `downsample`
//!   (Conv2d 1×1 with the block's stride, no bias, then BatchNorm2d).
//!   - BasicBlock (18, 34; expansion 1): `relu(bn2(conv2(relu(bn1(conv1(x))))) + identity)`,
//!     3×3 convs with padding 1, the stride on `conv1`.
//!   - Bottleneck (50 and up; expansion 4): `conv1` 1×1 → `bn1` → ReLU → `conv2` 3×3 with the
//!     block's stride (v1.5: the stride on the 3×3, not on the first 1×1) → `bn2` → ReLU →
//!     `conv3` 1×1 to 4× the planes → `bn3`, plus identity, then ReLU.
//! - adaptive average pool to 1×1, flatten, `fc` = Linear(8w·expansion → classes)
//! - loss: mean softmax cross-entropy
//! - optimizer: SGD, lr 0.1, momentum 0.9, weight decay 5e-4 (coupled, as `torch.optim.SGD`)
//! - resident state besides the parameters: every batch norm's `running_mean` and
//!   `running_var` (momentum 0.1, eps 1e-5), updated by the step in training mode; the
//!   evaluation step (traced in [`ingot_compiler::ir::Mode::Eval`], [`Model::eval_graph`]) normalises
//!   by them and leaves them as they are. (torchvision also keeps `num_batches_tracked`,
//!   which momentum 0.1 never reads; it is not a leaf here, and the trainer's `state_dict`
//!   reads and writes it around the model.)
//! - default initialisation, as torchvision's (`zero_init_residual=False`): conv weights
//!   normal(0, √(2 / fan_out)) with fan_out = out·k² (kaiming-normal, `mode="fan_out"`),
//!   batch norm gain one and bias zero, `fc` PyTorch's Linear default, running statistics
//!   zero and one.
//!
//! The reference `resnet18` has 11,181,642 parameters; `resnet:depth=50` at 1000 classes has
//! torchvision's 25,557,032.

use super::check::{check_float, check_size, model_err};
use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::error::Result;
use ingot_compiler::ir::{DType, Graph, Init, NodeId};
use ingot_compiler::model::Model;
use ingot_compiler::model::ID_DTYPE;
use ingot_compiler::trace::nn;
use std::fmt;

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

/// The `resnet18` at another batch size (for small tests); the parameters are the same.
pub fn resnet18_with(batch: usize, dtype: DType) -> Result<Model> {
    let name = if batch == RESNET_BATCH {
        "resnet18".to_string()
    } else {
        format!("resnet18 (batch {batch})")
    };
    let cfg = ResNetConfig {
        depth: 18,
        side: RESNET_SIDE,
        batch,
        classes: RESNET_CLASSES,
        width: 64,
    };
    build(&name, &cfg, dtype)
}

/// A ResNet's shape: the `resnet:` spec's keys. [`fmt::Display`] writes the spec's body
/// (`depth=50,side=224,batch=32,classes=1000,width=64`), which [`ResNetConfig::parse`] reads
/// back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResNetConfig {
    /// 18, 34, 50, 101 or 152: torchvision's five depths.
    pub depth: usize,
    /// The images' height and width (at least 32: the network halves it five times).
    pub side: usize,
    pub batch: usize,
    pub classes: usize,
    /// Channels of the stem and `layer1` (torchvision's 64); layer k has `width·2^(k-1)`
    /// planes.
    pub width: usize,
}

/// A ResNet's block: torchvision's `BasicBlock` or `Bottleneck`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Basic,
    Bottleneck,
}

impl Block {
    /// Output channels per plane (torchvision's `expansion`).
    fn expansion(self) -> usize {
        match self {
            Block::Basic => 1,
            Block::Bottleneck => 4,
        }
    }

    /// The block's convs `conv1, conv2, ...` from `in_ch` channels through `planes`, its
    /// stride on the 3×3 conv: torchvision's `BasicBlock` (two 3×3 convs to `planes`) and
    /// `Bottleneck` (v1.5: 1×1, 3×3, then 1×1 to `4·planes`).
    fn convs(self, in_ch: usize, planes: usize, stride: usize) -> Vec<ConvShape> {
        match self {
            Block::Basic => vec![
                ConvShape::new(in_ch, planes, 3, stride),
                ConvShape::new(planes, planes, 3, 1),
            ],
            Block::Bottleneck => vec![
                ConvShape::new(in_ch, planes, 1, 1),
                ConvShape::new(planes, planes, 3, stride),
                ConvShape::new(planes, planes * self.expansion(), 1, 1),
            ],
        }
    }
}

impl ResNetConfig {
    /// The spec's keys, in the order [`fmt::Display`] writes them.
    pub const KEYS: [&'static str; 5] = ["depth", "side", "batch", "classes", "width"];
    /// The depths torchvision defines.
    pub const DEPTHS: [usize; 5] = [18, 34, 50, 101, 152];
    /// Values of the keys a spec leaves out: ImageNet's side and classes, torchvision's width,
    /// and the per-GPU batch of torchvision's ImageNet recipe. `depth` has none.
    pub const DEFAULTS: ResNetConfig = ResNetConfig {
        depth: 0,
        side: 224,
        batch: 32,
        classes: 1000,
        width: 64,
    };

    /// torchvision's `resnet{depth}` at ImageNet's shape (224×224, 1000 classes) and `batch`.
    pub fn imagenet(depth: usize, batch: usize) -> ResNetConfig {
        ResNetConfig {
            depth,
            batch,
            ..ResNetConfig::DEFAULTS
        }
    }

    /// The block and the blocks per layer of `depth` (torchvision's table).
    fn layout(&self) -> Option<(Block, [usize; 4])> {
        Some(match self.depth {
            18 => (Block::Basic, [2, 2, 2, 2]),
            34 => (Block::Basic, [3, 4, 6, 3]),
            50 => (Block::Bottleneck, [3, 4, 6, 3]),
            101 => (Block::Bottleneck, [3, 4, 23, 3]),
            152 => (Block::Bottleneck, [3, 8, 36, 3]),
            _ => return None,
        })
    }

    /// The side of `layer4`'s output: the stem's conv and max pool and the first blocks of
    /// layers 2–4 each map a side s to ⌊(s − 1) / 2⌋ + 1.
    pub fn final_side(&self) -> usize {
        (0..5).fold(self.side, |s, _| s.saturating_sub(1) / 2 + 1)
    }

    /// The smallest batch this shape takes: every batch norm must see at least two values per
    /// channel (the running variance divides by n - 1), and `layer4`'s see the batch times
    /// its side squared: 2 where `layer4` is 1×1 (sides under 64), else 1.
    pub fn min_batch(&self) -> usize {
        let last = self.final_side();
        if last.saturating_mul(last) >= 2 {
            1
        } else {
            2
        }
    }

    /// Checks the shape, naming the key at fault (as `spec`'s error): a depth torchvision does
    /// not define, a zero, a side under 32 (five halvings would leave layers 3 and 4 nothing
    /// to downsample), a batch norm with one value per channel (batch 1 at a 1×1 `layer4`),
    /// or sizes whose bytes overflow.
    pub fn validate(&self, spec: &str) -> Result<()> {
        if self.layout().is_none() {
            return Err(model_err(
                spec,
                format!(
                    "key \"depth\": {} is not a ResNet depth torchvision defines (18, 34, 50, 101 or 152)",
                    self.depth
                ),
            ));
        }
        for (k, v) in [
            ("side", self.side),
            ("batch", self.batch),
            ("classes", self.classes),
            ("width", self.width),
        ] {
            if v == 0 {
                return Err(model_err(spec, format!("key {k:?} must be at least 1")));
            }
        }
        if self.side < 32 {
            return Err(model_err(
                spec,
                format!(
                    "key \"side\": {} is too small: the stem and layers 2-4 halve the image five times, so the side must be at least 32",
                    self.side
                ),
            ));
        }
        let last = self.final_side();
        if self.batch < self.min_batch() {
            return Err(model_err(
                spec,
                format!(
                    "key \"batch\": {} is too small: layer4's batch norms would see one value per channel ({}x{} images), and the running variance divides by n - 1; use a batch of at least {}",
                    self.batch,
                    last,
                    last,
                    self.min_batch()
                ),
            ));
        }
        let expansion = self.layout().map_or(1, |(b, _)| b.expansion());
        check_size(spec, "width", &[self.width, 8, expansion, self.width, 8])?;
        check_size(spec, "classes", &[self.classes, self.width, 8, expansion])?;
        check_size(
            spec,
            "batch",
            &[self.batch, self.width, self.side, self.side],
        )?;
        check_size(spec, "batch", &[self.batch, 3, self.side, self.side])?;
        Ok(())
    }
}

impl fmt::Display for ResNetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "depth={},side={},batch={},classes={},width={}",
            self.depth, self.side, self.batch, self.classes, self.width
        )
    }
}

/// torchvision's `resnet{depth}` as `cfg` shapes it, named `resnet:{cfg}`, in `dtype`.
pub fn resnet(cfg: &ResNetConfig, dtype: DType) -> Result<Model> {
    build(&format!("resnet:{cfg}"), cfg, dtype)
}

/// The model `cfg` shapes, named `name` (errors name it too).
fn build(name: &str, cfg: &ResNetConfig, dtype: DType) -> Result<Model> {
    check_float(name, dtype)?;
    cfg.validate(name)?;
    let Some((block, blocks)) = cfg.layout() else {
        return Err(model_err(name, "no such depth"));
    };
    let c = *cfg;
    let (graph, eval_graph) = Model::trace_modes(name, |g| {
        let x = g.input("x", [c.batch, 3, c.side, c.side], dtype)?;
        let y = g.input("y", [c.batch], ID_DTYPE)?;
        let h = conv(g, "conv1", x, ConvShape::new(3, c.width, 7, 2))?;
        let h = nn::batch_norm2d(g, "bn1", h, BN_EPS)?;
        let h = g.scoped("relu", |g| nn::relu(g, h))?;
        let mut h = g.scoped("maxpool", |g| nn::max_pool2d(g, h, 3, 2, 1))?;
        let mut ch = c.width;
        for (l, &n) in blocks.iter().enumerate() {
            let planes = c.width << l;
            for b in 0..n {
                let stride = if l > 0 && b == 0 { 2 } else { 1 };
                let name = format!("layer{}.{b}", l + 1);
                h = residual_block(g, &name, h, &block.convs(ch, planes, stride))?;
                ch = planes * block.expansion();
            }
        }
        let h = g.scoped("avgpool", |g| {
            let h = nn::global_avg_pool(g, h)?;
            nn::flatten(g, h)
        })?;
        let logits = nn::linear_kaiming(g, "fc", h, ch, c.classes, true)?;
        let loss = g.scoped("loss", |g| nn::softmax_cross_entropy(g, logits, y))?;
        g.set_output("loss", loss)?;
        Ok(())
    })?;
    Ok(Model {
        eval_graph,
        ..Model::new(name, graph, Optimizer::momentum(0.1, 0.9, 5e-4))
    })
}

/// One conv of the network: `in_ch → out_ch` channels, a square `kernel` (padded by half its
/// size), `stride`.
#[derive(Clone, Copy)]
struct ConvShape {
    in_ch: usize,
    out_ch: usize,
    kernel: usize,
    stride: usize,
}

impl ConvShape {
    fn new(in_ch: usize, out_ch: usize, kernel: usize, stride: usize) -> ConvShape {
        ConvShape {
            in_ch,
            out_ch,
            kernel,
            stride,
        }
    }
}

/// A conv without bias, kaiming-normal (fan_out) initialised, as torchvision's ResNets have.
fn conv(g: &mut Graph, name: &str, x: NodeId, c: ConvShape) -> Result<NodeId> {
    let std = (2.0 / (c.out_ch * c.kernel * c.kernel) as f64).sqrt();
    nn::conv2d_with_init(
        g,
        name,
        x,
        [c.in_ch, c.out_ch, c.kernel, c.stride, c.kernel / 2, 1, 1],
        false,
        Init::Normal { std },
    )
}

/// The block's `downsample` (the 1×1 conv `down`, then batch norm) when its stride or channel
/// count changes, else `x` itself.
fn shortcut(g: &mut Graph, name: &str, x: NodeId, down: ConvShape) -> Result<NodeId> {
    if down.stride == 1 && down.in_ch == down.out_ch {
        return Ok(x);
    }
    let d = conv(g, &format!("{name}.downsample.0"), x, down)?;
    nn::batch_norm2d(g, &format!("{name}.downsample.1"), d, BN_EPS)
}

/// `relu(h + identity)` in the block's `relu` scope (torchvision's blocks name their one ReLU
/// module `relu` and apply it after every batch norm but the last, then here).
fn join(g: &mut Graph, name: &str, h: NodeId, identity: NodeId) -> Result<NodeId> {
    g.scoped(&format!("{name}.relu"), |g| {
        let h = g.add(h, identity)?;
        nn::relu(g, h)
    })
}

/// The block named `name` on `x`: its convs ([`Block::convs`]; `convN` then `bnN`, a ReLU
/// between), joined with the shortcut.
fn residual_block(g: &mut Graph, name: &str, x: NodeId, convs: &[ConvShape]) -> Result<NodeId> {
    let mut h = x;
    for (i, &c) in convs.iter().enumerate() {
        if i > 0 {
            h = g.scoped(&format!("{name}.relu"), |g| nn::relu(g, h))?;
        }
        h = conv(g, &format!("{name}.conv{}", i + 1), h, c)?;
        h = nn::batch_norm2d(g, &format!("{name}.bn{}", i + 1), h, BN_EPS)?;
    }
    // The shortcut goes from the first conv's input to the last's output, with the block's
    // stride (the one conv's that is not 1).
    let stride = convs.iter().map(|c| c.stride).product();
    let (first, last) = (convs[0], convs[convs.len() - 1]);
    let down = ConvShape::new(first.in_ch, last.out_ch, 1, stride);
    let identity = shortcut(g, name, x, down)?;
    join(g, name, h, identity)
}
