//! Convolutional layers, as PyTorch's `torch.nn` has them, over NCHW images: the builder methods
//! of the window primitives ([`crate::ir::window`]) and the layers made of them and of the
//! ordinary primitives.
//!
//! - `conv2d`: `nn.Conv2d(in, out, k, stride, padding, dilation, groups, bias)`: weight
//!   `{name}.weight` `[out, in/groups, k, k]`, bias `{name}.bias` `[out]`, both initialised as
//!   PyTorch does by default (kaiming-uniform with `a = √5`, which is uniform on
//!   `±1/√fan_in` with `fan_in = in/groups · k²`; the bias the same bound).
//! - `max_pool2d`: `nn.MaxPool2d(k, stride, padding)` (padding is −∞).
//! - `avg_pool2d`: `nn.AvgPool2d(k, stride, padding)` with PyTorch's defaults
//!   (`count_include_pad=True`): a conv of each channel with a constant `1/k²` weight, so it
//!   needs no op of its own and its gradient is the conv's.
//! - `global_avg_pool`: the mean over H and W, `[N, C, 1, 1]` (`nn.AdaptiveAvgPool2d(1)`).
//! - `batch_norm2d`: `nn.BatchNorm2d(C)`, in training or evaluation mode (see [`batch_norm2d`]).
//! - `flatten`: `[N, ...] -> [N, rest]` (`torch.flatten(x, 1)`).

use super::layer_error::in_layer;
use crate::error::{IrError, Result};
use crate::ir::{Conv2d, DType, Graph, Init, Mode, NodeId, Op, Pool2d, Shape, WindowOp};

impl Graph {
    /// `conv2d(x [N,C,H,W], w [O,C/g,kh,kw]) -> [N,O,Ho,Wo]` (no bias).
    pub fn conv2d(&mut self, x: NodeId, w: NodeId, conv: Conv2d) -> Result<NodeId> {
        self.push(Op::Window(WindowOp::Conv2d(conv)), &[x, w], None)
    }

    /// The gradient of a conv's input of spatial size `input`, from the gradient of its output.
    pub fn conv2d_grad_input(
        &mut self,
        dy: NodeId,
        w: NodeId,
        conv: Conv2d,
        input: [usize; 2],
    ) -> Result<NodeId> {
        self.push(
            Op::Window(WindowOp::Conv2dGradInput { conv, input }),
            &[dy, w],
            None,
        )
    }

    /// The gradient of a conv's weight of spatial size `kernel`, from its input and the
    /// gradient of its output.
    pub fn conv2d_grad_weight(
        &mut self,
        x: NodeId,
        dy: NodeId,
        conv: Conv2d,
        kernel: [usize; 2],
    ) -> Result<NodeId> {
        self.push(
            Op::Window(WindowOp::Conv2dGradWeight { conv, kernel }),
            &[x, dy],
            None,
        )
    }

    /// The max of each window (padding is −∞).
    pub fn max_pool2d(&mut self, x: NodeId, pool: Pool2d) -> Result<NodeId> {
        self.push(Op::Window(WindowOp::MaxPool2d(pool)), &[x], None)
    }

    /// The gradient of `max_pool2d(x)`'s input from its output's gradient `dy`.
    pub fn max_pool2d_grad(&mut self, x: NodeId, dy: NodeId, pool: Pool2d) -> Result<NodeId> {
        self.push(Op::Window(WindowOp::MaxPool2dGrad(pool)), &[x, dy], None)
    }
}

fn image(g: &Graph, layer: &str, what: &'static str, x: NodeId) -> Result<([usize; 4], DType)> {
    let t = g.ty(x);
    match t.shape.dims() {
        &[n, c, h, w] if t.dtype.is_float() => Ok(([n, c, h, w], t.dtype)),
        _ => Err(IrError::Type {
            op: what,
            node: g.len(),
            operands: t.to_string(),
            reason: format!("layer {layer} takes a float NCHW image [N, C, H, W], got {t}"),
        }),
    }
}

/// `nn.Conv2d(in_ch, out_ch, kernel, stride, padding, dilation, groups, bias)` on `x`
/// `[N, in_ch, H, W]`. See the [module docs](self) for the parameters and their init.
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    g: &mut Graph,
    name: &str,
    x: NodeId,
    in_ch: usize,
    out_ch: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
    bias: bool,
) -> Result<NodeId> {
    // (conv2d_with_init refuses zero groups; max(1) only keeps this division defined.)
    let fan_in = (in_ch / groups.max(1)) * kernel * kernel;
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    conv2d_with_init(
        g,
        name,
        x,
        [in_ch, out_ch, kernel, stride, padding, dilation, groups],
        bias,
        Init::Uniform { bound },
    )
}

/// [`conv2d`] with the weight initialised by `weight_init` (torchvision's ResNets use
/// kaiming-normal with `mode="fan_out"`); `sizes` is `[in_ch, out_ch, kernel, stride, padding,
/// dilation, groups]`. A bias keeps PyTorch's default init.
pub fn conv2d_with_init(
    g: &mut Graph,
    name: &str,
    x: NodeId,
    sizes: [usize; 7],
    bias: bool,
    weight_init: Init,
) -> Result<NodeId> {
    // Every node of the layer carries its name (the report's and errors' provenance).
    g.scoped(name, |g| {
        let [in_ch, out_ch, kernel, stride, padding, dilation, groups] = sizes;
        let ([_, c, _, _], dtype) = image(g, name, "conv2d", x)?;
        if c != in_ch || groups == 0 || in_ch % groups != 0 {
            return Err(IrError::Type {
                op: "conv2d",
                node: g.len(),
                operands: g.ty(x).to_string(),
                reason: format!(
                    "layer {name} takes {in_ch} channels in {groups} group(s), but x has {c} channels"
                ),
            });
        }
        let fan_in = (in_ch / groups) * kernel * kernel;
        let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
        let conv = Conv2d {
            stride: [stride; 2],
            padding: [padding; 2],
            dilation: [dilation; 2],
            groups,
            layout: Default::default(),
        };
        (|| {
            let w = g.parameter(
                &format!("{name}.weight"),
                [out_ch, in_ch / groups, kernel, kernel],
                dtype,
                weight_init,
            )?;
            let y = g.conv2d(x, w, conv)?;
            if !bias {
                return Ok(y);
            }
            let b = g.parameter(
                &format!("{name}.bias"),
                [out_ch],
                dtype,
                Init::Uniform { bound },
            )?;
            let b = g.reshape(b, [out_ch, 1, 1])?;
            g.add(y, b)
        })()
        .map_err(|e| in_layer(name, e))
    })
}

/// `nn.MaxPool2d(kernel, stride, padding)` (dilation 1).
pub fn max_pool2d(
    g: &mut Graph,
    x: NodeId,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<NodeId> {
    g.max_pool2d(
        x,
        Pool2d {
            kernel: [kernel; 2],
            stride: [stride; 2],
            padding: [padding; 2],
            dilation: [1, 1],
            layout: crate::ir::ConvLayout::Nchw,
        },
    )
}

/// `nn.AvgPool2d(kernel, stride, padding)` with `count_include_pad=True` (PyTorch's default):
/// every window divides by `kernel²`. Each channel is convolved alone (the channels folded into
/// the batch) with a constant weight of `1/kernel²`.
pub fn avg_pool2d(
    g: &mut Graph,
    x: NodeId,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<NodeId> {
    let ([n, c, h, w], dtype) = image(g, "avg_pool2d", "avg_pool2d", x)?;
    if padding > kernel / 2 {
        return Err(IrError::Type {
            op: "avg_pool2d",
            node: g.len(),
            operands: g.ty(x).to_string(),
            reason: format!(
                "padding {padding} is more than half the kernel {kernel} (PyTorch's rule)"
            ),
        });
    }
    let folded = g.reshape(x, [n * c, 1, h, w])?;
    let k = g.full(
        1.0 / (kernel * kernel) as f64,
        [1, 1, kernel, kernel],
        dtype,
    )?;
    let conv = Conv2d {
        stride: [stride; 2],
        padding: [padding; 2],
        dilation: [1, 1],
        groups: 1,
        layout: Default::default(),
    };
    let y = g.conv2d(folded, k, conv)?;
    let d = g.ty(y).shape.dims().to_vec();
    g.reshape(y, [n, c, d[2], d[3]])
}

/// The mean over each channel's H×W, `[N, C, 1, 1]` (`nn.AdaptiveAvgPool2d(1)`).
pub fn global_avg_pool(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    image(g, "global_avg_pool", "global_avg_pool", x)?;
    g.mean(x, &[2, 3])
}

/// `torch.flatten(x, 1)`: `[N, d1, d2, ...] -> [N, d1·d2·...]`.
pub fn flatten(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    let dims = g.ty(x).shape.dims().to_vec();
    let Some((&n, rest)) = dims.split_first() else {
        return Err(IrError::Type {
            op: "flatten",
            node: g.len(),
            operands: g.ty(x).to_string(),
            reason: "a scalar has no batch axis to keep".into(),
        });
    };
    g.reshape(x, Shape::new(&[n, rest.iter().product()]))
}

/// The running-statistics momentum of `nn.BatchNorm2d` (PyTorch's default).
pub const BN_MOMENTUM: f64 = 0.1;

/// `nn.BatchNorm2d(C, eps, momentum=0.1)` in training mode on `x` `[N, C, H, W]`: each channel
/// normalised by the mean and biased variance over `(N, H, W)`, then scaled by `{name}.weight`
/// (ones) and shifted by `{name}.bias` (zeros). The running estimates `{name}.running_mean`
/// (zeros) and `{name}.running_var` (ones) are resident state the step updates in place, as
/// PyTorch does: `r ← (1 − 0.1)·r + 0.1·s`, with the unbiased variance (`· n/(n − 1)`).
///
/// Made of reductions and elementwise ops only, so fusion and autodiff treat it like
/// LayerNorm; the updates are declared on `g` ([`Graph::set_update`]) and the training step
/// keeps them.
///
/// Traced in [`Mode::Eval`] (`model.eval()`), it normalises by the running estimates instead,
/// `y = (x − running_mean) / √(running_var + eps) · weight + bias`, and updates nothing: the
/// same four leaves, read only.
pub fn batch_norm2d(g: &mut Graph, name: &str, x: NodeId, eps: f64) -> Result<NodeId> {
    // Every node of the layer carries its name (the report's and errors' provenance).
    g.scoped(name, |g| {
        let ([n, c, h, w], dtype) = image(g, name, "batch_norm2d", x)?;
        let count = n * h * w;
        (|| {
            let gain = g.parameter(&format!("{name}.weight"), [c], dtype, Init::Ones)?;
            let shift = g.parameter(&format!("{name}.bias"), [c], dtype, Init::Zeros)?;
            let rm = g.state(&format!("{name}.running_mean"), [c], dtype, Init::Zeros)?;
            let rv = g.state(&format!("{name}.running_var"), [c], dtype, Init::Ones)?;
            // `xc / √(var + eps) · weight + bias`, per channel: both modes end so.
            let scale_shift = |g: &mut Graph, xc: NodeId, var: NodeId| -> Result<NodeId> {
                let var_eps = g.add_scalar(var, eps)?;
                let std = g.sqrt(var_eps)?;
                let rstd = g.recip(std)?;
                let xhat = g.mul(xc, rstd)?;
                let gain4 = g.reshape(gain, [c, 1, 1])?;
                let shift4 = g.reshape(shift, [c, 1, 1])?;
                let y = g.mul(xhat, gain4)?;
                g.add(y, shift4)
            };
            if g.mode() == Mode::Eval {
                let rm4 = g.reshape(rm, [c, 1, 1])?;
                let rv4 = g.reshape(rv, [c, 1, 1])?;
                let xc = g.sub(x, rm4)?;
                return scale_shift(g, xc, rv4);
            }
            let axes = [0, 2, 3];
            let mean = g.mean(x, &axes)?;
            let xc = g.sub(x, mean)?;
            let sq = g.mul(xc, xc)?;
            let var = g.mean(sq, &axes)?;
            let y = scale_shift(g, xc, var)?;
            // The running estimates: no gradient flows into them (they do not reach the loss).
            let m = BN_MOMENTUM;
            let mean_c = g.reshape(mean, [c])?;
            let mean_c = g.stop_gradient(mean_c)?;
            let old_m = g.mul_scalar(rm, 1.0 - m)?;
            let new_m = g.mul_scalar(mean_c, m)?;
            let new_rm = g.add(old_m, new_m)?;
            let var_c = g.reshape(var, [c])?;
            let var_c = g.stop_gradient(var_c)?;
            let unbiased = count as f64 / (count.max(2) - 1) as f64;
            let old_v = g.mul_scalar(rv, 1.0 - m)?;
            let new_v = g.mul_scalar(var_c, m * unbiased)?;
            let new_rv = g.add(old_v, new_v)?;
            g.set_update(rm, new_rm)?;
            g.set_update(rv, new_rv)?;
            Ok(y)
        })()
        .map_err(|e| in_layer(name, e))
    })
}

/// `nn.Linear(in → out)` with PyTorch's default init (kaiming-uniform with `a = √5`: weight and
/// bias uniform on `±1/√in`), for models specified with PyTorch's defaults (the CNNs); the
/// math and names are [`super::nn::linear`]'s.
pub fn linear_kaiming(
    g: &mut Graph,
    name: &str,
    x: NodeId,
    in_features: usize,
    out_features: usize,
    bias: bool,
) -> Result<NodeId> {
    // Every node of the layer carries its name (the report's and errors' provenance).
    g.scoped(name, |g| {
        let t = g.ty(x).clone();
        if t.shape.rank() != 2 || t.shape.last() != in_features || !t.dtype.is_float() {
            return Err(IrError::Type {
                op: "linear",
                node: g.len(),
                operands: t.to_string(),
                reason: format!("layer {name} takes float inputs [N, {in_features}], got {t}"),
            });
        }
        let bound = 1.0 / (in_features.max(1) as f64).sqrt();
        (|| {
            let w = g.parameter(
                &format!("{name}.weight"),
                [out_features, in_features],
                t.dtype,
                Init::Uniform { bound },
            )?;
            let wt = g.transpose_last(w)?;
            let y = g.matmul(x, wt)?;
            if !bias {
                return Ok(y);
            }
            let b = g.parameter(
                &format!("{name}.bias"),
                [out_features],
                t.dtype,
                Init::Uniform { bound },
            )?;
            g.add(y, b)
        })()
        .map_err(|e| in_layer(name, e))
    })
}
