//! Sliding-window ops over NCHW images: 2-d convolution with its two backward ops, and max
//! pooling with its backward. They are one [`Op::Window`](super::Op::Window) variant, so every
//! pass that treats them alike (the planner sees library calls; the rewriter carries them
//! through unchanged) needs one match arm.
//!
//! Everything else a CNN needs is spelled with existing primitives: a conv's bias is a
//! broadcast add, average pooling is a conv with a constant weight (`nn::avg_pool2d`), global
//! average pooling a mean, batch norm reductions and elementwise ops.
//!
//! # Semantics (PyTorch's)
//! - `conv2d(x [N,C,H,W], w [O,C/g,kh,kw]) -> [N,O,Ho,Wo]`,
//!   `y[n,o,i,j] = Σ_{c,a,b} x[n, (o/(O/g))·(C/g) + c, i·s₀ − p₀ + a·d₀, j·s₁ − p₁ + b·d₁] · w[o,c,a,b]`
//!   with zeros outside the image, `Ho = (H + 2p₀ − d₀(kh − 1) − 1)/s₀ + 1` (floor).
//! - `conv2d_grad_input(dy, w) input=[H,W]`: the adjoint of `conv2d` in `x` (the gradient of
//!   the input), `[N, (C/g)·g, H, W]`.
//! - `conv2d_grad_weight(x, dy) kernel=[kh,kw]`: the adjoint in `w`, `[O, C/g, kh, kw]`.
//! - `max_pool2d(x)`: the max of each window, padding being −∞; the first maximum wins, a NaN
//!   wins over every number (PyTorch's `val > max || isnan(val)` scan in row-major window
//!   order), and a window entirely in the padding gives −∞.
//! - `max_pool2d_grad(x, dy)`: each window's `dy` added at the element the forward picked
//!   (recomputed from `x`, so no index tensor is stored), nothing for an all-padding window.

use super::shape::Shape;
use super::tensor_type::TensorType;
use ingot_kernels::DType;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// A 2-d convolution's geometry (the kernel size is the weight's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Conv2d {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    /// How the activations and the weight are stored; NCHW (PyTorch's) unless the compiler
    /// chose channels-last for the target (the `layout` stage, after the rewrite). Serialized only when not NCHW,
    /// so an NCHW step's executable reads and writes as before.
    #[serde(default, skip_serializing_if = "ConvLayout::is_nchw")]
    pub layout: ConvLayout,
}

/// The memory order of a convolution's tensors. The op's semantics (the module docs) are
/// always stated in NCHW's axes; a channels-last convolution stores the same tensors with
/// the channel axis innermost.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ConvLayout {
    /// Activations `[N, C, H, W]`, weights `[O, C/g, kh, kw]` (PyTorch's).
    #[default]
    Nchw,
    /// Channels last: activations `[N, H, W, C]`, weights `[O, kh, kw, C/g]` (cuDNN's NHWC
    /// filter format): each tensor is the NCHW one transposed by [`ConvLayout::NHWC_PERM`].
    Nhwc,
}

impl ConvLayout {
    /// Stored axis `i` of a channels-last tensor is NCHW axis `NHWC_PERM[i]`.
    pub const NHWC_PERM: [usize; 4] = [0, 2, 3, 1];
    /// Stored axis `i` of an NCHW tensor is channels-last axis `NCHW_PERM[i]` (the inverse).
    pub const NCHW_PERM: [usize; 4] = [0, 3, 1, 2];

    /// True for the default, NCHW.
    pub fn is_nchw(&self) -> bool {
        *self == ConvLayout::Nchw
    }

    /// The name in the IR text form (`layout=...`).
    pub fn name(self) -> &'static str {
        match self {
            ConvLayout::Nchw => "nchw",
            ConvLayout::Nhwc => "nhwc",
        }
    }

    /// The stored dims of a tensor whose NCHW dims are `d`.
    pub fn store(self, d: [usize; 4]) -> [usize; 4] {
        match self {
            ConvLayout::Nchw => d,
            ConvLayout::Nhwc => Self::NHWC_PERM.map(|a| d[a]),
        }
    }

    /// The NCHW dims of a tensor stored with dims `d` in this layout.
    pub fn logical(self, d: [usize; 4]) -> [usize; 4] {
        match self {
            ConvLayout::Nchw => d,
            ConvLayout::Nhwc => Self::NCHW_PERM.map(|a| d[a]),
        }
    }
}

/// A 2-d pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Pool2d {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    /// How the image and the result are stored: NCHW unless the `layout` stage made the
    /// pooling channels-last with the convolutions around it. Serialized only when not NCHW,
    /// as a convolution's.
    #[serde(default, skip_serializing_if = "ConvLayout::is_nchw")]
    pub layout: ConvLayout,
}

/// A sliding-window op over NCHW images (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum WindowOp {
    /// `(x, w) -> y`.
    Conv2d(Conv2d),
    /// `(dy, w) -> dx`, `dx` of spatial size `input`.
    Conv2dGradInput { conv: Conv2d, input: [usize; 2] },
    /// `(x, dy) -> dw`, `dw` of spatial size `kernel`.
    Conv2dGradWeight { conv: Conv2d, kernel: [usize; 2] },
    /// `x -> y`.
    MaxPool2d(Pool2d),
    /// `(x, dy) -> dx`.
    MaxPool2dGrad(Pool2d),
}

/// Where [`WindowOp::with_attrs`] reads attributes from (the text parser's attribute list).
pub trait ReadAttrs {
    /// A two-number list attribute `key=[A,B]`.
    fn pair(&mut self, key: &str) -> Result<[usize; 2], String>;
    /// A non-negative integer attribute `key=N`.
    fn int(&mut self, key: &str) -> Result<usize, String>;
    /// A one-word attribute `key=WORD`, `None` where it is absent.
    fn optional_word(&mut self, key: &str) -> Result<Option<String>, String>;
}

/// The output size of a window `kernel` wide with this geometry over `input` elements, or
/// `None` when no window fits (or the sizes overflow).
pub fn out_size(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    let span = dilation
        .checked_mul(kernel.checked_sub(1)?)?
        .checked_add(1)?;
    let padded = input.checked_add(padding.checked_mul(2)?)?;
    if stride == 0 || padded < span {
        return None;
    }
    Some((padded - span) / stride + 1)
}

impl WindowOp {
    /// All the names, for the text parser.
    pub const NAMES: [&'static str; 5] = [
        "conv2d",
        "conv2d_grad_input",
        "conv2d_grad_weight",
        "max_pool2d",
        "max_pool2d_grad",
    ];

    pub fn name(&self) -> &'static str {
        match self {
            WindowOp::Conv2d(_) => "conv2d",
            WindowOp::Conv2dGradInput { .. } => "conv2d_grad_input",
            WindowOp::Conv2dGradWeight { .. } => "conv2d_grad_weight",
            WindowOp::MaxPool2d(_) => "max_pool2d",
            WindowOp::MaxPool2dGrad(_) => "max_pool2d_grad",
        }
    }

    /// The op named `name`, attributes to be filled in by [`WindowOp::with_attrs`].
    pub fn from_name(name: &str) -> Option<WindowOp> {
        let conv = Conv2d {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            layout: ConvLayout::Nchw,
        };
        let pool = Pool2d {
            layout: ConvLayout::Nchw,
            kernel: [1, 1],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
        };
        Some(match name {
            "conv2d" => WindowOp::Conv2d(conv),
            "conv2d_grad_input" => WindowOp::Conv2dGradInput {
                conv,
                input: [0, 0],
            },
            "conv2d_grad_weight" => WindowOp::Conv2dGradWeight {
                conv,
                kernel: [0, 0],
            },
            "max_pool2d" => WindowOp::MaxPool2d(pool),
            "max_pool2d_grad" => WindowOp::MaxPool2dGrad(pool),
            _ => return None,
        })
    }

    /// The attributes in the text form, each `key=value` preceded by a space.
    pub fn write_attrs(&self, s: &mut String) {
        let pair = |p: [usize; 2]| format!("[{},{}]", p[0], p[1]);
        let conv = |s: &mut String, c: &Conv2d| {
            let _ = write!(
                s,
                " stride={} padding={} dilation={} groups={}",
                pair(c.stride),
                pair(c.padding),
                pair(c.dilation),
                c.groups
            );
            // Printed only where not the default, so every NCHW text reads as before.
            if c.layout != ConvLayout::Nchw {
                let _ = write!(s, " layout={}", c.layout.name());
            }
        };
        let pool = |s: &mut String, p: &Pool2d| {
            let _ = write!(
                s,
                " kernel={} stride={} padding={} dilation={}",
                pair(p.kernel),
                pair(p.stride),
                pair(p.padding),
                pair(p.dilation)
            );
            if p.layout != ConvLayout::Nchw {
                let _ = write!(s, " layout={}", p.layout.name());
            }
        };
        match self {
            WindowOp::Conv2d(c) => conv(s, c),
            WindowOp::Conv2dGradInput { conv: c, input } => {
                conv(s, c);
                let _ = write!(s, " input={}", pair(*input));
            }
            WindowOp::Conv2dGradWeight { conv: c, kernel } => {
                conv(s, c);
                let _ = write!(s, " kernel={}", pair(*kernel));
            }
            WindowOp::MaxPool2d(p) | WindowOp::MaxPool2dGrad(p) => pool(s, p),
        }
    }

    /// This op with its attributes read from `a` (the text parser's attributes).
    pub fn with_attrs(self, a: &mut dyn ReadAttrs) -> Result<WindowOp, String> {
        fn layout(a: &mut dyn ReadAttrs) -> Result<ConvLayout, String> {
            Ok(match a.optional_word("layout")?.as_deref() {
                None | Some("nchw") => ConvLayout::Nchw,
                Some("nhwc") => ConvLayout::Nhwc,
                Some(w) => return Err(format!("`layout=` must be `nchw` or `nhwc`, found `{w}`")),
            })
        }
        fn conv(a: &mut dyn ReadAttrs) -> Result<Conv2d, String> {
            Ok(Conv2d {
                stride: a.pair("stride")?,
                padding: a.pair("padding")?,
                dilation: a.pair("dilation")?,
                groups: a.int("groups")?,
                layout: layout(a)?,
            })
        }
        fn pool(a: &mut dyn ReadAttrs) -> Result<Pool2d, String> {
            Ok(Pool2d {
                kernel: a.pair("kernel")?,
                stride: a.pair("stride")?,
                padding: a.pair("padding")?,
                dilation: a.pair("dilation")?,
                layout: layout(a)?,
            })
        }
        Ok(match self {
            WindowOp::Conv2d(_) => WindowOp::Conv2d(conv(a)?),
            WindowOp::Conv2dGradInput { .. } => WindowOp::Conv2dGradInput {
                conv: conv(a)?,
                input: a.pair("input")?,
            },
            WindowOp::Conv2dGradWeight { .. } => WindowOp::Conv2dGradWeight {
                conv: conv(a)?,
                kernel: a.pair("kernel")?,
            },
            WindowOp::MaxPool2d(_) => WindowOp::MaxPool2d(pool(a)?),
            WindowOp::MaxPool2dGrad(_) => WindowOp::MaxPool2dGrad(pool(a)?),
        })
    }

    /// The attribute keys the op takes, for the parser's "unknown attribute" message.
    pub fn allowed(&self) -> &'static str {
        match self {
            WindowOp::Conv2d(_) => "it takes `stride=[A,B] padding=[A,B] dilation=[A,B] groups=N` and optionally `layout=nhwc`",
            WindowOp::Conv2dGradInput { .. } => {
                "it takes `stride=` `padding=` `dilation=` `groups=` `input=[H,W]` and optionally `layout=nhwc`"
            }
            WindowOp::Conv2dGradWeight { .. } => {
                "it takes `stride=` `padding=` `dilation=` `groups=` `kernel=[KH,KW]` and optionally `layout=nhwc`"
            }
            WindowOp::MaxPool2d(_) | WindowOp::MaxPool2dGrad(_) => {
                "it takes `kernel=[A,B] stride=[A,B] padding=[A,B] dilation=[A,B]` and optionally `layout=nhwc`"
            }
        }
    }

    /// The result type of this op on these operands, or why it does not apply.
    pub fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, String> {
        let want = match self {
            WindowOp::MaxPool2d(_) => 1,
            _ => 2,
        };
        if operands.len() != want {
            return Err(format!("takes {want} operand(s), got {}", operands.len()));
        }
        for (i, t) in operands.iter().enumerate() {
            if t.shape.rank() != 4 {
                return Err(format!(
                    "operand {i} must be a 4-d NCHW tensor, got {}",
                    t.shape
                ));
            }
            if !matches!(t.dtype, DType::F32 | DType::F64 | DType::BF16)
                || t.dtype != operands[0].dtype
            {
                return Err(format!(
                    "operands must share one float dtype (f32, f64 or bf16), got {}",
                    t.dtype
                ));
            }
        }
        // A channels-last conv is checked in NCHW's axes: its operands' dims are read back
        // into NCHW order and its result's stored in its own.
        let layout = match self {
            WindowOp::MaxPool2d(p) | WindowOp::MaxPool2dGrad(p) => p.layout,
            _ => self.layout(),
        };
        let dims = |i: usize| -> [usize; 4] {
            let d = operands[i].shape.dims();
            layout.logical([d[0], d[1], d[2], d[3]])
        };
        let dtype = operands[0].dtype;
        let make = |d: [usize; 4]| TensorType::new(Shape::new(&layout.store(d)), dtype);
        match self {
            WindowOp::Conv2d(c) => {
                let ([n, ch, h, w], wd) = (dims(0), dims(1));
                let (o, out) = conv_check(c, ch, [h, w], wd)?;
                Ok(make([n, o, out[0], out[1]]))
            }
            WindowOp::Conv2dGradInput { conv: c, input } => {
                let ([n, o, oh, ow], wd) = (dims(0), dims(1));
                let ch = wd[1]
                    .checked_mul(c.groups)
                    .ok_or("the channel count overflows")?;
                let (wo, out) = conv_check(c, ch, *input, wd)?;
                if wo != o || out != [oh, ow] {
                    return Err(format!(
                        "the gradient is [{n},{o},{oh},{ow}], but a conv of a {}x{} input with this weight gives [{n},{wo},{},{}]",
                        input[0], input[1], out[0], out[1]
                    ));
                }
                Ok(make([n, ch, input[0], input[1]]))
            }
            WindowOp::Conv2dGradWeight { conv: c, kernel } => {
                let ([n, ch, h, w], [dn, o, oh, ow]) = (dims(0), dims(1));
                if n != dn {
                    return Err(format!("batch sizes {n} and {dn} differ"));
                }
                if c.groups == 0 || ch % c.groups != 0 {
                    return Err(format!(
                        "{ch} input channels do not split into {} groups",
                        c.groups
                    ));
                }
                let wd = [o, ch / c.groups, kernel[0], kernel[1]];
                let (_, out) = conv_check(c, ch, [h, w], wd)?;
                if out != [oh, ow] {
                    return Err(format!(
                        "the gradient is {oh}x{ow}, but this conv gives {}x{}",
                        out[0], out[1]
                    ));
                }
                Ok(make(wd))
            }
            WindowOp::MaxPool2d(p) => {
                let [n, ch, h, w] = dims(0);
                let out = pool_check(p, [h, w])?;
                Ok(make([n, ch, out[0], out[1]]))
            }
            WindowOp::MaxPool2dGrad(p) => {
                let ([n, ch, h, w], dy) = (dims(0), dims(1));
                let out = pool_check(p, [h, w])?;
                if dy != [n, ch, out[0], out[1]] {
                    return Err(format!(
                        "the gradient is {}, but pooling [{n},{ch},{h},{w}] gives [{n},{ch},{},{}]",
                        operands[1].shape, out[0], out[1]
                    ));
                }
                Ok(make([n, ch, h, w]))
            }
        }
    }
}

/// Checks a conv of `ch` channels of `hw` images with weight dims `wd`; gives the output
/// channels and spatial size.
fn conv_check(
    c: &Conv2d,
    ch: usize,
    hw: [usize; 2],
    wd: [usize; 4],
) -> Result<(usize, [usize; 2]), String> {
    let [o, cg, kh, kw] = wd;
    if c.groups == 0 {
        return Err("groups must be at least 1".into());
    }
    if c.stride.contains(&0) || c.dilation.contains(&0) {
        return Err("stride and dilation must be at least 1".into());
    }
    if !ch.is_multiple_of(c.groups) || !o.is_multiple_of(c.groups) {
        return Err(format!(
            "{ch} input and {o} output channels must both split into {} groups",
            c.groups
        ));
    }
    if ch / c.groups != cg {
        return Err(format!(
            "the weight takes {cg} channels per group, the input has {} ({ch} in {} groups)",
            ch / c.groups,
            c.groups
        ));
    }
    if kh == 0 || kw == 0 || o == 0 {
        return Err("the weight has an empty axis".into());
    }
    let mut out = [0; 2];
    for i in 0..2 {
        let k = [kh, kw][i];
        out[i] = out_size(hw[i], k, c.stride[i], c.padding[i], c.dilation[i]).ok_or_else(|| {
            format!(
                "a kernel of {k} dilated {} does not fit axis {} of size {} padded by {}",
                c.dilation[i],
                i + 2,
                hw[i],
                c.padding[i]
            )
        })?;
    }
    Ok((o, out))
}

fn pool_check(p: &Pool2d, hw: [usize; 2]) -> Result<[usize; 2], String> {
    if p.stride.contains(&0) || p.dilation.contains(&0) || p.kernel.contains(&0) {
        return Err("kernel, stride and dilation must be at least 1".into());
    }
    let mut out = [0; 2];
    for i in 0..2 {
        if p.padding[i] > p.kernel[i] / 2 {
            return Err(format!(
                "padding {} is more than half the kernel {} (PyTorch's rule)",
                p.padding[i], p.kernel[i]
            ));
        }
        out[i] = out_size(hw[i], p.kernel[i], p.stride[i], p.padding[i], p.dilation[i])
            .ok_or_else(|| {
                format!(
                    "a window of {} dilated {} does not fit axis {} of size {} padded by {}",
                    p.kernel[i],
                    p.dilation[i],
                    i + 2,
                    hw[i],
                    p.padding[i]
                )
            })?;
    }
    Ok(out)
}

impl WindowOp {
    /// The convolution's geometry and layout; `None` for pooling.
    pub fn conv(&self) -> Option<&Conv2d> {
        match self {
            WindowOp::Conv2d(c)
            | WindowOp::Conv2dGradInput { conv: c, .. }
            | WindowOp::Conv2dGradWeight { conv: c, .. } => Some(c),
            WindowOp::MaxPool2d(_) | WindowOp::MaxPool2dGrad(_) => None,
        }
    }

    /// The layout of a convolution's tensors (NCHW for pooling, which has no other).
    pub fn layout(&self) -> ConvLayout {
        self.conv().map_or(ConvLayout::Nchw, |c| c.layout)
    }

    /// The kernel geometry of a conv op whose operands have dims `operands` and whose result has
    /// dims `result` (both as [`WindowOp::infer`] accepted them), and which pass it runs; `None`
    /// for pooling or dims that do not make a conv. The geometry is in NCHW's terms for either
    /// layout: a caller that runs the conv must look at [`WindowOp::layout`] too.
    pub fn conv_geometry(
        &self,
        operands: &[&[usize]],
        result: &[usize],
    ) -> Option<(
        ingot_kernels::cpu::conv::ConvGeometry,
        ingot_kernels::cpu::conv::Pass,
    )> {
        use ingot_kernels::cpu::conv::{ConvGeometry, Pass};
        // The geometry is NCHW's whatever the layout (callers check [`WindowOp::layout`]).
        let layout = self.layout();
        let four = |d: &[usize]| -> Option<[usize; 4]> { Some(layout.logical(d.try_into().ok()?)) };
        let (conv, x, w, pass) = match self {
            WindowOp::Conv2d(c) => (
                c,
                four(operands.first()?)?,
                four(operands.get(1)?)?,
                Pass::Forward,
            ),
            WindowOp::Conv2dGradInput { conv, .. } => (
                conv,
                four(result)?,
                four(operands.get(1)?)?,
                Pass::GradInput,
            ),
            WindowOp::Conv2dGradWeight { conv, .. } => (
                conv,
                four(operands.first()?)?,
                four(result)?,
                Pass::GradWeight,
            ),
            WindowOp::MaxPool2d(_) | WindowOp::MaxPool2dGrad(_) => return None,
        };
        let g =
            ConvGeometry::new(x, w, conv.stride, conv.padding, conv.dilation, conv.groups).ok()?;
        Some((g, pass))
    }

    /// The kernel geometry of a pooling op over an `x` of (stored) dims `x`; `None` for a conv.
    pub fn pool_geometry(&self, x: &[usize]) -> Option<ingot_kernels::cpu::pool::PoolGeometry> {
        let (WindowOp::MaxPool2d(p) | WindowOp::MaxPool2dGrad(p)) = self else {
            return None;
        };
        let x: [usize; 4] = x.try_into().ok()?;
        let [n, c, h, w] = p.layout.logical(x);
        let mut out_hw = [0; 2];
        for i in 0..2 {
            out_hw[i] = out_size(
                [h, w][i],
                p.kernel[i],
                p.stride[i],
                p.padding[i],
                p.dilation[i],
            )?;
        }
        Some(ingot_kernels::cpu::pool::PoolGeometry {
            planes: n.checked_mul(c)?,
            in_hw: [h, w],
            kernel: p.kernel,
            stride: p.stride,
            padding: p.padding,
            dilation: p.dilation,
            out_hw,
            inner: match p.layout {
                ConvLayout::Nchw => 1,
                ConvLayout::Nhwc => c,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::text::parse;
    use crate::ir::{Conv2d, ConvLayout, DType, Graph, Pool2d};

    const CONV: Conv2d = Conv2d {
        stride: [2, 1],
        padding: [1, 0],
        dilation: [1, 2],
        groups: 2,
        layout: crate::ir::ConvLayout::Nchw,
    };
    const POOL: Pool2d = Pool2d {
        kernel: [3, 2],
        stride: [2, 2],
        padding: [1, 0],
        dilation: [1, 1],
        layout: ConvLayout::Nchw,
    };

    fn every_window_op() -> Graph {
        let mut g = Graph::new();
        let x = g.input("x", [2, 4, 9, 8], DType::F32).unwrap();
        let w = g.input("w", [6, 2, 3, 2], DType::F32).unwrap();
        let y = g.conv2d(x, w, CONV).unwrap();
        let dx = g.conv2d_grad_input(y, w, CONV, [9, 8]).unwrap();
        let dw = g.conv2d_grad_weight(x, y, CONV, [3, 2]).unwrap();
        let p = g.max_pool2d(dx, POOL).unwrap();
        let dp = g.max_pool2d_grad(dx, p, POOL).unwrap();
        g.set_output("dw", dw).unwrap();
        g.set_output("dp", dp).unwrap();
        g
    }

    #[test]
    fn window_ops_infer_pytorch_shapes() {
        let g = every_window_op();
        let dims = |i: u32| g.ty(crate::ir::NodeId(i)).shape.dims().to_vec();
        // (9 + 2 - 3)/2 + 1 = 5 and (8 - 2·1 - 1)/1 + 1 = 6.
        assert_eq!(dims(2), [2, 6, 5, 6]);
        assert_eq!(dims(3), [2, 4, 9, 8]);
        assert_eq!(dims(4), [6, 2, 3, 2]);
        // (9 + 2 - 3)/2 + 1 = 5 and (8 - 2)/2 + 1 = 4.
        assert_eq!(dims(5), [2, 4, 5, 4]);
        assert_eq!(dims(6), [2, 4, 9, 8]);
    }

    #[test]
    fn window_ops_print_and_parse_back_to_the_same_graph_and_text() {
        let g = every_window_op();
        let text = g.to_string();
        assert!(
            text.contains(
                "conv2d(%0, %1) stride=[2,1] padding=[1,0] dilation=[1,2] groups=2 : f32[2,6,5,6]"
            ),
            "{text}"
        );
        assert!(text.contains("input=[9,8]"), "{text}");
        assert!(
            text.contains("max_pool2d(%3) kernel=[3,2] stride=[2,2]"),
            "{text}"
        );
        let back = parse(&text).unwrap();
        assert_eq!(back, g);
        assert_eq!(back.to_string(), text);
    }

    #[test]
    fn a_channels_last_conv_infers_channels_last_shapes_and_its_layout_survives_the_text_form() {
        use crate::ir::ConvLayout;
        let conv = Conv2d {
            layout: ConvLayout::Nhwc,
            ..CONV
        };
        let mut g = Graph::new();
        // The NCHW x [2,4,9,8] and w [6,2,3,2] of `every_window_op`, stored channels-last.
        let x = g.input("x", [2, 9, 8, 4], DType::F32).unwrap();
        let w = g.input("w", [6, 3, 2, 2], DType::F32).unwrap();
        let y = g.conv2d(x, w, conv).unwrap();
        let dx = g.conv2d_grad_input(y, w, conv, [9, 8]).unwrap();
        let dw = g.conv2d_grad_weight(x, y, conv, [3, 2]).unwrap();
        let dims = |i| g.ty(i).shape.dims().to_vec();
        assert_eq!(dims(y), [2, 5, 6, 6]);
        assert_eq!(dims(dx), [2, 9, 8, 4]);
        assert_eq!(dims(dw), [6, 3, 2, 2]);
        g.set_output("dx", dx).unwrap();
        g.set_output("dw", dw).unwrap();
        let text = g.to_string();
        assert_eq!(text.matches("layout=nhwc").count(), 3, "{text}");
        let back = parse(&text).unwrap();
        assert_eq!(back, g);
        // The NCHW default is never printed, and `layout=nchw` reads as it.
        let nchw = every_window_op().to_string();
        assert!(!nchw.contains("layout="), "{nchw}");
        let spelled = nchw.replace("groups=2 :", "groups=2 layout=nchw :");
        assert_ne!(spelled, nchw);
        assert_eq!(parse(&spelled).unwrap(), every_window_op());
        let bad = nchw.replace("groups=2 :", "groups=2 layout=nwhc :");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("`nchw` or `nhwc`") && e.contains("nwhc"), "{e}");
    }

    #[test]
    fn an_nchw_conv_serializes_as_before_and_a_channels_last_one_keeps_its_layout() {
        use crate::ir::ConvLayout;
        let json = serde_json::to_string(&CONV).unwrap();
        assert!(!json.contains("layout"), "{json}");
        assert_eq!(serde_json::from_str::<Conv2d>(&json).unwrap(), CONV);
        let nhwc = Conv2d {
            layout: ConvLayout::Nhwc,
            ..CONV
        };
        let json = serde_json::to_string(&nhwc).unwrap();
        assert!(json.contains(r#""layout":"nhwc""#), "{json}");
        assert_eq!(serde_json::from_str::<Conv2d>(&json).unwrap(), nhwc);
    }

    #[test]
    fn a_conv_whose_channels_disagree_is_a_type_error_naming_the_node() {
        let mut g = Graph::new();
        let x = g.input("x", [1, 3, 8, 8], DType::F32).unwrap();
        let w = g.input("w", [4, 2, 3, 3], DType::F32).unwrap();
        let e = g
            .conv2d(x, w, Conv2d { groups: 1, ..CONV })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("conv2d (node %2)") && e.contains("channels"),
            "{e}"
        );
        let x = g.input("x2", [1, 3, 2, 2], DType::F32).unwrap();
        let e = g
            .max_pool2d(
                x,
                Pool2d {
                    kernel: [5, 5],
                    padding: [0, 0],
                    ..POOL
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("max_pool2d (node %3)") && e.contains("does not fit"),
            "{e}"
        );
    }

    #[test]
    fn bad_window_attributes_in_text_are_errors_naming_the_line() {
        let base = "ingot-ir 1\n%0 = input \"x\" : f32[1,1,4,4]\n%1 = input \"w\" : f32[1,1,3,3]\n";
        for (line, want) in [
            (
                "%2 = conv2d(%0, %1) stride=[1] padding=[0,0] dilation=[1,1] groups=1 : f32[1,1,2,2]",
                "two numbers",
            ),
            (
                "%2 = conv2d(%0, %1) stride=[1,1] padding=[0,0] dilation=[1,1] : f32[1,1,2,2]",
                "groups=",
            ),
            (
                "%2 = conv2d(%0, %1) stride=[0,1] padding=[0,0] dilation=[1,1] groups=1 : f32[1,1,2,2]",
                "at least 1",
            ),
            (
                "%2 = conv2d(%0, %1) stride=[1,1] padding=[0,0] dilation=[1,1] groups=1 : f32[1,1,3,3]",
                "stated result",
            ),
            (
                "%2 = max_pool2d(%0) kernel=[2,2] stride=[2,2] padding=[2,2] dilation=[1,1] : f32[1,1,4,4]",
                "more than half",
            ),
        ] {
            let e = parse(&format!("{base}{line}\n")).unwrap_err().to_string();
            assert!(e.contains("line 4") && e.contains(want), "{line}: {e}");
        }
    }
}
