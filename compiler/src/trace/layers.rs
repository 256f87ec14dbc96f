//! The IR text form's layer lines ([`crate::ir::text::layers`]) built with the Rust API's own
//! layers, so that `%2 = linear(%1) "fc1" out=16 : f32[4,16]` in a model file and
//! `nn::linear(g, "fc1", x, 8, 16, true)` in Rust give the same nodes and parameters.

use super::{conv, nn};
use crate::error::{IrError, Result};
use crate::ir::text::{self, Layer, Layers, Parsed};
use crate::ir::{Graph, Init, Mode, NodeId};

/// Builds each layer line with [`nn`] and [`conv`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Nn;

impl Layers for Nn {
    fn build(&self, g: &mut Graph, layer: &Layer, inputs: &[NodeId]) -> Result<NodeId> {
        let Some(&x) = inputs.first() else {
            return Err(IrError::Invalid(format!(
                "{} needs an operand",
                layer.keyword()
            )));
        };
        let dims = g.ty(x).shape.dims().to_vec();
        match layer {
            Layer::Linear {
                name,
                out,
                bias,
                init,
            } => {
                let init = init.unwrap_or(Init::Normal { std: nn::INIT_STD });
                let in_features = dims.last().copied().unwrap_or(0);
                nn::linear_with_init(g, name, x, [in_features, *out], *bias, init)
            }
            Layer::Conv2d {
                name,
                out,
                kernel,
                stride,
                padding,
                dilation,
                groups,
                bias,
            } => {
                let in_ch = dims.get(1).copied().unwrap_or(0);
                conv::conv2d(
                    g, name, x, in_ch, *out, *kernel, *stride, *padding, *dilation, *groups, *bias,
                )
            }
            Layer::LayerNorm { name, eps } => nn::layer_norm(g, name, x, *eps),
            Layer::Embedding {
                name,
                rows,
                dim,
                dtype,
            } => nn::embedding(g, name, x, *rows, *dim, *dtype),
            Layer::Relu => nn::relu(g, x),
            Layer::GeluTanh => nn::gelu_tanh(g, x),
            Layer::Softmax => nn::softmax(g, x),
            Layer::LogSoftmax => nn::log_softmax(g, x),
            Layer::CrossEntropy => match inputs {
                [logits, labels] => nn::softmax_cross_entropy(g, *logits, *labels),
                _ => Err(IrError::Invalid(
                    "cross_entropy takes two operands (logits, labels)".into(),
                )),
            },
            Layer::Flatten => conv::flatten(g, x),
        }
    }
}

/// Reads a model's text form in `mode`, its layer lines built by [`Nn`]
/// ([`text::parse_with`]).
pub fn parse(text: &str, mode: Mode) -> Result<Parsed> {
    text::parse_with(text, mode, Some(&Nn))
}
