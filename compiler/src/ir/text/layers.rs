//! Layer lines: one line of the text form that stands for a whole layer of the Rust API
//! (`linear`, `conv2d` with its bias, `layer_norm`, `cross_entropy`, ...), so that a model
//! written by hand is a few lines rather than a page of primitives.
//!
//! A layer line looks like a node line, and states its result type like one:
//!
//! ```text
//! %2 = linear(%0) "fc1" out=16 : f32[4,16]
//! ```
//!
//! It expands, as it is read, into the very ops (and parameters, with PyTorch's names) that the
//! layer of `trace::nn` or `trace::conv` adds when a model is traced in Rust, so a layer line
//! and the same layer traced in Rust give equal graphs. The IR comes before tracing in the
//! pipeline, so this module only reads the line ([`Layer`]); what builds it is a [`Layers`]
//! given to [`super::parse_with`] (`trace::layers::Nn`, which `Model::from_ir_text` and so
//! `ingot --model-file` use). The layers' table ([`LAYERS`]) is documented on
//! docs/ir-reference.md beside the ops.

use crate::error::IrError;
use crate::ir::graph::{Graph, NodeId};
use crate::ir::op::Init;
use ingot_kernels::DType;

/// A layer line as read, its attributes checked, before anything is built.
#[derive(Clone, Debug, PartialEq)]
pub enum Layer {
    /// `x [..., in] -> [..., out]`: `x · weightᵀ + bias` (`nn.Linear`).
    Linear {
        name: String,
        out: usize,
        bias: bool,
        /// The weight's initialisation; `None` is the Rust API's default (normal(0.02)).
        init: Option<Init>,
    },
    /// `x [N, in, H, W] -> [N, out, Ho, Wo]` (`nn.Conv2d`, square kernel).
    Conv2d {
        name: String,
        out: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
        bias: bool,
    },
    /// LayerNorm over the last axis (`nn.LayerNorm(d, eps)`).
    LayerNorm { name: String, eps: f64 },
    /// `ids [...] -> [..., dim]` (`nn.Embedding(rows, dim)`).
    Embedding {
        name: String,
        rows: usize,
        dim: usize,
        /// The table's dtype: the line's result's.
        dtype: DType,
    },
    /// `relu(x)`, PyTorch's gradient at 0 (`nn::relu`).
    Relu,
    /// GELU with the tanh approximation (`nn::gelu_tanh`).
    GeluTanh,
    /// Softmax over the last axis.
    Softmax,
    /// Log-softmax over the last axis.
    LogSoftmax,
    /// Mean softmax cross-entropy of logits `[N, C]` against class ids `[N]`.
    CrossEntropy,
    /// `[N, d1, d2, ...] -> [N, d1·d2·...]` (`torch.flatten(x, 1)`).
    Flatten,
}

impl Layer {
    /// The layer's name on the line (`linear`).
    pub fn keyword(&self) -> &'static str {
        match self {
            Layer::Linear { .. } => "linear",
            Layer::Conv2d { .. } => "conv2d",
            Layer::LayerNorm { .. } => "layer_norm",
            Layer::Embedding { .. } => "embedding",
            Layer::Relu => "relu",
            Layer::GeluTanh => "gelu_tanh",
            Layer::Softmax => "softmax",
            Layer::LogSoftmax => "log_softmax",
            Layer::CrossEntropy => "cross_entropy",
            Layer::Flatten => "flatten",
        }
    }
}

/// What builds a [`Layer`] into a graph. The tracing stage's `trace::layers::Nn` builds each
/// with the Rust API's own layer; the parser calls it once per layer line.
pub trait Layers {
    /// Adds `layer` reading `inputs` (the line's operands, already defined) to `g` and returns
    /// the node that is the line's result. A shape or dtype the layer cannot take is an error.
    fn build(&self, g: &mut Graph, layer: &Layer, inputs: &[NodeId]) -> Result<NodeId, IrError>;
}

/// One layer of the text form, as docs/ir-reference.md lists it.
#[derive(Clone, Copy, Debug)]
pub struct LayerDoc {
    /// The word the line uses.
    pub name: &'static str,
    /// Its operands, in order.
    pub operands: &'static str,
    /// Whether the line gives the layer's name (the prefix of its parameters' names).
    pub named: bool,
    /// Its attributes, optional ones with their defaults.
    pub attributes: &'static str,
    /// What it computes and the parameters it adds.
    pub meaning: &'static str,
    /// Lines of the text form (no header) whose last line uses it.
    pub example: &'static str,
}

const fn layer(
    name: &'static str,
    operands: &'static str,
    named: bool,
    attributes: &'static str,
    meaning: &'static str,
    example: &'static str,
) -> LayerDoc {
    LayerDoc {
        name,
        operands,
        named,
        attributes,
        meaning,
        example,
    }
}

/// Every layer the text form reads, in the page's order.
pub const LAYERS: &[LayerDoc] = &[
    layer(
        "linear",
        "(x)",
        true,
        "`out=N`; optional `bias=true|false` (default `true`), `init=normal(STD)|uniform(BOUND)|zeros|ones` (the weight's; default `normal(0.02)`)",
        "`nn.Linear(in, out)` on `x [..., in]`: `x · weightᵀ + bias`, `[..., out]`. Adds `NAME.weight` `[out, in]` and `NAME.bias` `[out]` (zeros).",
        "%0 = input \"x\" : f32[4,8]\n%1 = linear(%0) \"fc1\" out=16 : f32[4,16]",
    ),
    layer(
        "conv2d",
        "(x)",
        true,
        "`out=N kernel=K`; optional `stride=S` (1), `padding=P` (0), `dilation=D` (1), `groups=G` (1), `bias=true|false` (`true`)",
        "`nn.Conv2d(in, out, K, S, P, D, G)` on an NCHW image `x [N, in, H, W]`. Adds `NAME.weight` `[out, in/G, K, K]` and `NAME.bias` `[out]`, both uniform on `±1/√(in/G·K²)` as PyTorch initialises them. With a name string `conv2d` is this layer; without one it is the primitive `conv2d(x, w)` above.",
        "%0 = input \"x\" : f32[2,3,8,8]\n%1 = conv2d(%0) \"conv1\" out=4 kernel=3 padding=1 : f32[2,4,8,8]",
    ),
    layer(
        "layer_norm",
        "(x)",
        true,
        "optional `eps=F` (default `1e-5`)",
        "`nn.LayerNorm(d, eps)` over the last axis of `x [..., d]` (the biased variance). Adds `NAME.weight` (ones) and `NAME.bias` (zeros), both `[d]`.",
        "%0 = input \"x\" : f32[4,8]\n%1 = layer_norm(%0) \"ln1\" : f32[4,8]",
    ),
    layer(
        "embedding",
        "(ids)",
        true,
        "`rows=N dim=D`",
        "`nn.Embedding(rows, dim)`: the rows of `NAME.weight` `[rows, dim]` (normal(0.02), of the result's dtype) picked by integer `ids [...]`, `[..., dim]`.",
        "%0 = input \"x\" init=ids(100) : i64[4,8]\n%1 = embedding(%0) \"wte\" rows=100 dim=16 : f32[4,8,16]",
    ),
    layer(
        "relu",
        "(x)",
        false,
        "-",
        "`x` where `x > 0`, else 0; NaN stays NaN and the gradient at 0 is 0, as PyTorch's.",
        "%0 = input \"x\" : f32[4,8]\n%1 = relu(%0) : f32[4,8]",
    ),
    layer(
        "gelu_tanh",
        "(x)",
        false,
        "-",
        "GELU with the tanh approximation (`F.gelu(x, approximate=\"tanh\")`).",
        "%0 = input \"x\" : f32[4,8]\n%1 = gelu_tanh(%0) : f32[4,8]",
    ),
    layer(
        "softmax",
        "(x)",
        false,
        "-",
        "Softmax over the last axis.",
        "%0 = input \"x\" : f32[4,8]\n%1 = softmax(%0) : f32[4,8]",
    ),
    layer(
        "log_softmax",
        "(x)",
        false,
        "-",
        "Log-softmax over the last axis.",
        "%0 = input \"x\" : f32[4,8]\n%1 = log_softmax(%0) : f32[4,8]",
    ),
    layer(
        "cross_entropy",
        "(logits, labels)",
        false,
        "-",
        "The mean softmax cross-entropy of float `logits [N, C]` against integer class ids `labels [N]` (`F.cross_entropy`), a scalar; a classifier trained on it also reports top-1 and top-5 accuracy under `--val`.",
        "%0 = input \"z\" : f32[4,10]\n%1 = input \"y\" init=ids(10) : i64[4]\n%2 = cross_entropy(%0, %1) : f32[]",
    ),
    layer(
        "flatten",
        "(x)",
        false,
        "-",
        "`torch.flatten(x, 1)`: `[N, d1, d2, ...]` to `[N, d1·d2·...]`.",
        "%0 = input \"x\" : f32[2,4,3,3]\n%1 = flatten(%0) : f32[2,36]",
    ),
];

/// The layer a line's word names: `conv2d` is the layer only with a name string (without one
/// it is the primitive op); the others whenever they are written.
pub(super) fn layer_named(word: &str, has_name: bool) -> Option<&'static LayerDoc> {
    if word == "conv2d" && !has_name {
        return None;
    }
    LAYERS.iter().find(|l| l.name == word)
}
