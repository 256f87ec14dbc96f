//! Layers as plain functions over a [`Graph`]: each one adds its parameters (named as PyTorch
//! names them, `{name}.weight` and `{name}.bias`) and its primitive ops, and returns the result.
//!
//! Every layer takes its float dtype from its input, so the same code traces an `f32` training
//! step and an `f64` gradient check. Errors from the builder name the op and the shapes; the
//! layers add which layer they were building (`... (in layer blocks.0.qkv)`).
//!
//! The math is PyTorch's, written out:
//! - `linear`: `x · Wᵀ + b`, with `W` stored `[out, in]`.
//! - `layer_norm`: `(x − mean) / sqrt(var + eps) · weight + bias`, biased variance, last axis.
//! - `gelu_tanh`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (`approximate="tanh"`).
//! - `relu`: 0 where `x <= 0`, else `x` (NaN stays NaN; see [`relu`] for why a select and not
//!   a max).
//! - `softmax`, `log_softmax`: over the last axis, shifted by the row max.
//! - `causal_self_attention`: nanoGPT's `CausalSelfAttention` without dropout.
//! - `softmax_cross_entropy`: `F.cross_entropy(logits, targets)` with `reduction="mean"`.
//! - `dropout`: `nn.Dropout(p)`: in training mode `x · mask / (1 − p)` with a mask drawn per
//!   step from the step's seed input ([`DROPOUT_SEED`]); the identity in evaluation mode.

pub use super::conv::{
    avg_pool2d, batch_norm2d, conv2d, conv2d_with_init, flatten, global_avg_pool, linear_kaiming,
    max_pool2d, BN_MOMENTUM,
};
pub use super::layer_error::in_layer;
use crate::error::{IrError, Result};
use crate::ir::{CmpOp, DType, Graph, Init, Mode, NodeId, Shape};

/// The name of the step input dropout draws its masks from: an `i64` scalar the trainer writes
/// before each step (from the run's seed and the step's number,
/// [`ingot_kernels::rng::step_seed`]), so a run repeats and a resumed run continues it.
pub const DROPOUT_SEED: &str = "dropout_seed";

/// `nn.Dropout(p)` named `name` on `x` (f32, f64 or bf16): in [`Mode::Train`] each element is
/// zeroed with probability `p` and the rest scaled by `1/(1 − p)`, by the `dropout` primitive
/// ([`crate::ir::Op::Dropout`]) over the step's seed input [`DROPOUT_SEED`] (declared by the
/// first dropout layer) with the layer's name hashed as its salt, so layers draw independent
/// masks and nothing random is stored: the backward pass draws the same mask again. In
/// [`Mode::Eval`], and for `p = 0`, it is `x` itself. A `p` outside `[0, 1]` is an error naming
/// the layer.
pub fn dropout(g: &mut Graph, name: &str, x: NodeId, p: f64) -> Result<NodeId> {
    if !(0.0..=1.0).contains(&p) {
        return Err(IrError::Type {
            op: "dropout",
            node: g.len(),
            operands: g.ty(x).to_string(),
            reason: format!("layer {name}: p = {p} is not a probability in [0, 1]"),
        });
    }
    if g.mode() == Mode::Eval || p == 0.0 {
        return Ok(x);
    }
    g.scoped(name, |g| {
        let seed = match g.leaf(DROPOUT_SEED) {
            Some(s) => s,
            None => g.input(DROPOUT_SEED, Shape::scalar(), DType::I64)?,
        };
        g.dropout_mask(x, seed, p, ingot_kernels::rng::salt_of(name))
    })
    .map_err(|e| in_layer(name, e))
}

/// The standard deviation of the default weight initialisation (reference-models.md).
pub const INIT_STD: f64 = 0.02;

fn float_dtype(g: &Graph, layer: &str, what: &'static str, x: NodeId) -> Result<DType> {
    let t = g.ty(x);
    if t.dtype.is_float() {
        Ok(t.dtype)
    } else {
        Err(IrError::Type {
            op: what,
            node: g.len(),
            operands: t.to_string(),
            reason: format!(
                "layer {layer} needs a float input (f32 or f64), got {}",
                t.dtype
            ),
        })
    }
}

/// The last axis of a tensor with at least one axis.
fn last_axis(g: &Graph, x: NodeId) -> usize {
    g.ty(x).shape.rank().saturating_sub(1)
}

/// `Linear(in → out)`: `x [..., in] → [..., out]`, computing `x · Wᵀ + b`.
///
/// Adds `{name}.weight` `[out, in]` (normal(0, 0.02)) and, with `bias`, `{name}.bias` `[out]`
/// (zeros). `x` is flattened to `[N, in]` for one matrix product and reshaped back.
pub fn linear(
    g: &mut Graph,
    name: &str,
    x: NodeId,
    in_features: usize,
    out_features: usize,
    bias: bool,
) -> Result<NodeId> {
    let init = Init::Normal { std: INIT_STD };
    linear_with_init(g, name, x, [in_features, out_features], bias, init)
}

/// [`linear`] with the weight initialised by `weight_init` (an IR file's `linear ... init=`);
/// `sizes` is `[in_features, out_features]`. The bias is zeros.
pub fn linear_with_init(
    g: &mut Graph,
    name: &str,
    x: NodeId,
    sizes: [usize; 2],
    bias: bool,
    weight_init: Init,
) -> Result<NodeId> {
    let [in_features, out_features] = sizes;
    let dtype = float_dtype(g, name, "linear", x)?;
    let xs = g.ty(x).shape.clone();
    if xs.rank() == 0 || xs.last() != in_features {
        return Err(IrError::Type {
            op: "linear",
            node: g.len(),
            operands: g.ty(x).to_string(),
            reason: format!(
                "layer {name} takes inputs [..., {in_features}] (its weight is {}), but x has shape {xs}",
                Shape::new(&[out_features, in_features])
            ),
        });
    }
    let lead = &xs.dims()[..xs.rank() - 1];
    let n: usize = lead.iter().product();
    g.scoped(name, |g| {
        let w = g.parameter(
            &format!("{name}.weight"),
            [out_features, in_features],
            dtype,
            weight_init,
        )?;
        let x2 = g.reshape(x, [n, in_features])?;
        let wt = g.transpose_last(w)?;
        let mut y = g.matmul(x2, wt)?;
        if bias {
            let b = g.parameter(&format!("{name}.bias"), [out_features], dtype, Init::Zeros)?;
            y = g.add(y, b)?;
        }
        let mut out: Vec<usize> = lead.to_vec();
        out.push(out_features);
        g.reshape(y, Shape::new(&out))
    })
    .map_err(|e| in_layer(name, e))
}

/// LayerNorm over the last axis, as `torch.nn.LayerNorm(d, eps)`: gain `{name}.weight` (ones) and
/// `{name}.bias` (zeros), both `[d]`; the variance is the biased one (divided by `d`).
pub fn layer_norm(g: &mut Graph, name: &str, x: NodeId, eps: f64) -> Result<NodeId> {
    let dtype = float_dtype(g, name, "layer_norm", x)?;
    if g.ty(x).shape.rank() == 0 {
        return Err(IrError::Type {
            op: "layer_norm",
            node: g.len(),
            operands: g.ty(x).to_string(),
            reason: format!("layer {name} needs an input with at least one axis"),
        });
    }
    let d = g.ty(x).shape.last();
    let ax = last_axis(g, x);
    g.scoped(name, |g| {
        let w = g.parameter(&format!("{name}.weight"), [d], dtype, Init::Ones)?;
        let b = g.parameter(&format!("{name}.bias"), [d], dtype, Init::Zeros)?;
        let mean = g.mean(x, &[ax])?;
        let xc = g.sub(x, mean)?;
        let sq = g.mul(xc, xc)?;
        let var = g.mean(sq, &[ax])?;
        let var_eps = g.add_scalar(var, eps)?;
        let std = g.sqrt(var_eps)?;
        let rstd = g.recip(std)?;
        let xhat = g.mul(xc, rstd)?;
        let y = g.mul(xhat, w)?;
        g.add(y, b)
    })
    .map_err(|e| in_layer(name, e))
}

/// `Embedding(rows, dim)`: `ids [...]` (i32 or i64) → `[..., dim]`, the rows of `{name}.weight`
/// `[rows, dim]` (normal(0, 0.02)) picked by a gather. `dtype` is the table's (the ids are integers).
pub fn embedding(
    g: &mut Graph,
    name: &str,
    ids: NodeId,
    rows: usize,
    dim: usize,
    dtype: DType,
) -> Result<NodeId> {
    g.scoped(name, |g| {
        let w = g.parameter(
            &format!("{name}.weight"),
            [rows, dim],
            dtype,
            Init::Normal { std: INIT_STD },
        )?;
        g.gather(w, ids)
    })
    .map_err(|e| in_layer(name, e))
}

/// GELU, tanh approximation (`F.gelu(x, approximate="tanh")`):
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub fn gelu_tanh(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    // PyTorch spells √(2/π) as M_SQRT2 · M_2_SQRTPI · 0.5; the same product gives the same bits.
    let beta = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
    let x2 = g.mul(x, x)?;
    let x3 = g.mul(x2, x)?;
    let kx3 = g.mul_scalar(x3, 0.044715)?;
    let inner = g.add(x, kx3)?;
    let scaled = g.mul_scalar(inner, beta)?;
    let t = g.tanh(scaled)?;
    let one_plus = g.add_scalar(t, 1.0)?;
    let half_x = g.mul_scalar(x, 0.5)?;
    g.mul(half_x, one_plus)
}

/// ReLU: 0 where `x <= 0`, else `x`; NaN stays NaN, as PyTorch's `relu` keeps it.
///
/// Spelled as `select(x <= 0, 0, x)` rather than `max(x, 0)`: the forward values are the same,
/// and the gradient is then exactly PyTorch's whatever rule the autodiff uses for ties in `max`:
/// PyTorch's backward (`threshold_backward(grad, result, 0)`) passes the gradient where the
/// output is not `<= 0`, so zero at `x == 0` and the gradient itself where `x` is NaN. The
/// backward also keeps only a one-byte mask, not `x`. (Written `select(x > 0, x, 0)`, a NaN
/// input would give 0: a model with NaN weights would report a finite loss.)
pub fn relu(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    let dtype = g.ty(x).dtype;
    let zero = g.full(0.0, Shape::scalar(), dtype)?;
    let off = g.compare(CmpOp::Le, x, zero)?;
    g.select(off, zero, x)
}

/// Softmax over the last axis: `exp(x − max) / Σ exp(x − max)`.
pub fn softmax(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    let ax = last_axis(g, x);
    let m = row_max_shift(g, x, ax)?;
    let z = g.sub(x, m)?;
    let e = g.exp(z)?;
    let s = g.sum(e, &[ax])?;
    g.div(e, s)
}

/// Log-softmax over the last axis: `(x − max) − log Σ exp(x − max)`.
pub fn log_softmax(g: &mut Graph, x: NodeId) -> Result<NodeId> {
    let ax = last_axis(g, x);
    let m = row_max_shift(g, x, ax)?;
    let z = g.sub(x, m)?;
    let e = g.exp(z)?;
    let s = g.sum(e, &[ax])?;
    let lse = g.log(s)?;
    g.sub(z, lse)
}

/// The max along `ax` that softmax subtracts for range. Softmax does not depend on the shift,
/// so no gradient flows through it: without the stop, autodiff would emit the max's backward
/// (a compare, a count, a division and a select per row) only to add up exactly zero.
fn row_max_shift(g: &mut Graph, x: NodeId, ax: usize) -> Result<NodeId> {
    let m = g.max(x, &[ax])?;
    g.stop_gradient(m)
}

/// The value masked attention scores take: the dtype's most negative finite number.
///
/// `exp(masked − rowmax)` is exactly 0, as with `−inf` (every row keeps its diagonal, so the row max
/// is finite), but every value stays finite: no `inf · 0` can turn into NaN in any backward or
/// rewrite, and constants survive formats (JSON) that have no infinity.
pub fn mask_value(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f32::MIN as f64,
        DType::BF16 => ingot_kernels::dtype::bf16::MIN.to_f64(),
        _ => f64::MIN,
    }
}

/// The causal mask `[t, t]` (bool): true at `(i, j)` where `j > i`, the future positions a query
/// at position `i` must not see.
pub fn causal_mask(g: &mut Graph, t: usize) -> Result<NodeId> {
    let i = g.iota([t, t], 0, DType::I32)?;
    let j = g.iota([t, t], 1, DType::I32)?;
    g.compare(CmpOp::Gt, j, i)
}

/// Causal multi-head self-attention (nanoGPT's `CausalSelfAttention`, no dropout).
///
/// `x [B, T, d]` → `[B, T, d]`. `qkv = linear({name}.qkv, d → 3d)` split along the last axis into
/// q, k, v in that order; each becomes `[B, H, T, hd]` (`hd = d / heads`); scores
/// `q · kᵀ · (1/√hd)` `[B, H, T, T]` as a rank-4 batched matmul; future positions (`j > i`) set to
/// [`mask_value`]; softmax over the last axis; times v; heads merged back to `[B, T, d]`; then
/// `linear({name}.proj, d → d)`. Parameters: `{name}.qkv.weight` `[3d, d]`, `{name}.qkv.bias`,
/// `{name}.proj.weight` `[d, d]`, `{name}.proj.bias`.
#[allow(clippy::manual_is_multiple_of)] // the workspace's rust-version (1.85) predates it
pub fn causal_self_attention(g: &mut Graph, name: &str, x: NodeId, heads: usize) -> Result<NodeId> {
    let dtype = float_dtype(g, name, "attention", x)?;
    let dims = g.ty(x).shape.dims().to_vec();
    if dims.len() != 3 || heads == 0 || dims[2] % heads != 0 {
        return Err(IrError::Type {
            op: "attention",
            node: g.len(),
            operands: g.ty(x).to_string(),
            reason: format!(
                "layer {name} takes x [batch, seq, d] with d divisible by heads ({heads})"
            ),
        });
    }
    let (b, t, d) = (dims[0], dims[1], dims[2]);
    let hd = d / heads;
    let qkv = linear(g, &format!("{name}.qkv"), x, d, 3 * d, true)?;
    let y = g
        .scoped(&format!("{name}.attn"), |g| {
            let q = g.slice(qkv, 2, 0, d)?;
            let k = g.slice(qkv, 2, d, 2 * d)?;
            let v = g.slice(qkv, 2, 2 * d, 3 * d)?;
            let q = g.reshape(q, [b, t, heads, hd])?;
            let k = g.reshape(k, [b, t, heads, hd])?;
            let v = g.reshape(v, [b, t, heads, hd])?;
            let q = g.transpose(q, &[0, 2, 1, 3])?; // [B, H, T, hd]
            let kt = g.transpose(k, &[0, 2, 3, 1])?; // [B, H, hd, T]
            let v = g.transpose(v, &[0, 2, 1, 3])?; // [B, H, T, hd]
            let scores = g.matmul(q, kt)?; // [B, H, T, T]
            let scores = g.mul_scalar(scores, 1.0 / (hd as f64).sqrt())?;
            let mask = causal_mask(g, t)?;
            let masked = g.full(mask_value(dtype), Shape::scalar(), dtype)?;
            let scores = g.select(mask, masked, scores)?;
            let att = softmax(g, scores)?;
            let y = g.matmul(att, v)?; // [B, H, T, hd]
            let y = g.transpose(y, &[0, 2, 1, 3])?; // [B, T, H, hd]
            g.reshape(y, [b, t, d])
        })
        .map_err(|e| in_layer(name, e))?;
    linear(g, &format!("{name}.proj"), y, d, d, true)
}

/// Mean softmax cross-entropy: `logits [N, C]` (float), `targets [N]` (i32 or i64 class ids in
/// `0..C`) → a scalar, `−(1/N) Σₙ log_softmax(logits)[n, targets[n]]`.
///
/// The target's log-probability is picked with a one-hot mask (`iota == target`) and a select, so
/// the loss and its gradient stay elementwise ops and reductions.
pub fn softmax_cross_entropy(g: &mut Graph, logits: NodeId, targets: NodeId) -> Result<NodeId> {
    let (lt, tt) = (g.ty(logits).clone(), g.ty(targets).clone());
    let ok = lt.dtype.is_float()
        && tt.dtype.is_int()
        && lt.shape.rank() == 2
        && tt.shape.rank() == 1
        && lt.shape.dims()[0] == tt.shape.dims()[0];
    if !ok {
        return Err(IrError::Type {
            op: "softmax_cross_entropy",
            node: g.len(),
            operands: format!("{lt}, {tt}"),
            reason: "takes float logits [N, C] and integer targets [N]".into(),
        });
    }
    let (n, c) = (lt.shape.dims()[0], lt.shape.dims()[1]);
    let lsm = log_softmax(g, logits)?;
    let classes = g.iota([n, c], 1, tt.dtype)?;
    let t = g.reshape(targets, [n, 1])?;
    let hot = g.compare(CmpOp::Eq, classes, t)?;
    let zero = g.full(0.0, Shape::scalar(), lt.dtype)?;
    let picked = g.select(hot, lsm, zero)?;
    // Each row's loss first (a row reduction, fusable with the log-softmax), then their sum.
    let rows = g.sum(picked, &[1])?;
    let total = g.sum_all(rows)?;
    g.mul_scalar(total, -1.0 / n as f64)
}

/// The logits and the one-hot label mask of `g`'s softmax cross-entropy (as
/// [`softmax_cross_entropy`] builds it) over labels read from the rank-1 input `y`: the last
/// `select(hot, log_softmax(logits), 0)` whose mask compares class ids (an iota) with `y`.
/// `None` when there is none. Used to count top-k accuracy beside the loss
/// ([`super::accuracy`]).
pub fn softmax_cross_entropy_parts(g: &Graph) -> Option<(NodeId, NodeId)> {
    let y = g.leaf("y")?;
    if g.ty(y).shape.rank() != 1 {
        return None;
    }
    cross_entropy_parts(g)
}

/// As [`softmax_cross_entropy_parts`], over labels `y` of any rank whose elements are the
/// logits' rows (a language model's `[batch, seq]` targets against `[batch·seq, vocab]`
/// logits): what the inference steps read the logits off ([`super::logits`]).
pub fn cross_entropy_parts(g: &Graph) -> Option<(NodeId, NodeId)> {
    use crate::ir::Op;
    let y = g.leaf("y")?;
    let n = g.ty(y).shape.numel();
    let is = |id: NodeId, op: &Op| &g.node(id).op == op;
    let reads_y = |mut id: NodeId| {
        // The labels reach the compare through views (reshape, broadcast) and casts only.
        for _ in 0..4 {
            if id == y {
                return true;
            }
            match g.node(id).inputs.as_slice() {
                [one] => id = *one,
                _ => return false,
            }
        }
        id == y
    };
    (0..g.len() as u32).rev().map(NodeId).find_map(|id| {
        let node = g.node(id);
        let [hot, lsm, _zero] = node.inputs.as_slice() else {
            return None;
        };
        if node.op != Op::Select || node.ty.shape.rank() != 2 || node.ty.shape.dims()[0] != n {
            return None;
        }
        let mask = g.node(*hot);
        let [a, b] = mask.inputs.as_slice() else {
            return None;
        };
        let iota_vs_y =
            |i: NodeId, t: NodeId| matches!(g.node(i).op, Op::Iota { axis: 1 }) && reads_y(t);
        if mask.op != Op::Compare(CmpOp::Eq) || !(iota_vs_y(*a, *b) || iota_vs_y(*b, *a)) {
            return None;
        }
        // log_softmax(x) = (x - max) - log(sum(exp(x - max))).
        let sub = Op::Binary(crate::ir::BinaryOp::Sub);
        let [z, _lse] = g.node(*lsm).inputs.as_slice() else {
            return None;
        };
        if !is(*lsm, &sub) || !is(*z, &sub) {
            return None;
        }
        let logits = g.node(*z).inputs[0];
        (g.ty(logits).shape == node.ty.shape).then_some((logits, *hot))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{LeafKind, Op, TensorType};

    fn params(g: &Graph) -> Vec<(String, Shape)> {
        g.leaves(LeafKind::Parameter)
            .into_iter()
            .map(|id| (g.leaf_name(id).unwrap().to_string(), g.ty(id).shape.clone()))
            .collect()
    }

    #[test]
    fn linear_maps_the_last_axis_and_names_weight_and_bias_as_pytorch() {
        let mut g = Graph::new();
        let x = g.input("x", [2, 3, 5], DType::F32).unwrap();
        let y = linear(&mut g, "fc", x, 5, 7, true).unwrap();
        assert_eq!(*g.ty(y), TensorType::new([2, 3, 7], DType::F32));
        assert_eq!(
            params(&g),
            vec![
                ("fc.weight".into(), Shape::new(&[7, 5])),
                ("fc.bias".into(), Shape::new(&[7]))
            ]
        );
        g.verify().unwrap();
    }

    #[test]
    fn linear_without_bias_has_only_a_weight() {
        let mut g = Graph::new();
        let x = g.input("x", [4, 5], DType::F64).unwrap();
        let y = linear(&mut g, "head", x, 5, 2, false).unwrap();
        assert_eq!(*g.ty(y), TensorType::new([4, 2], DType::F64));
        assert_eq!(
            params(&g),
            vec![("head.weight".into(), Shape::new(&[2, 5]))]
        );
    }

    #[test]
    fn a_linear_with_the_wrong_input_width_names_the_layer_and_both_shapes() {
        let mut g = Graph::new();
        let x = g.input("x", [256, 783], DType::F32).unwrap();
        let e = linear(&mut g, "fc1", x, 784, 1024, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fc1"), "{e}");
        assert!(e.contains("[256,783]"), "{e}");
        assert!(e.contains("[1024,784]"), "{e}");
        assert!(
            g.leaves(LeafKind::Parameter).is_empty(),
            "no parameter is added on error"
        );
    }

    #[test]
    fn builder_errors_inside_a_layer_name_the_layer() {
        let mut g = Graph::new();
        let x = g.input("x", [2, 4, 6], DType::F32).unwrap();
        // A parameter name taken already: the builder's error gains the layer's name.
        g.parameter("blk.qkv.weight", [1], DType::F32, Init::Zeros)
            .unwrap();
        let e = causal_self_attention(&mut g, "blk", x, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("(in layer blk.qkv)"), "{e}");
    }

    #[test]
    fn layer_norm_keeps_the_shape_and_adds_gain_one_and_bias_zero() {
        let mut g = Graph::new();
        let x = g.input("x", [3, 8], DType::F64).unwrap();
        let y = layer_norm(&mut g, "ln", x, 1e-5).unwrap();
        assert_eq!(*g.ty(y), TensorType::new([3, 8], DType::F64));
        let w = g.leaf("ln.weight").unwrap();
        let b = g.leaf("ln.bias").unwrap();
        assert!(matches!(
            g.node(w).op,
            Op::Leaf {
                init: Init::Ones,
                ..
            }
        ));
        assert!(matches!(
            g.node(b).op,
            Op::Leaf {
                init: Init::Zeros,
                ..
            }
        ));
        g.verify().unwrap();
    }

    #[test]
    fn activations_and_softmaxes_keep_shape_and_dtype() {
        for dtype in [DType::F32, DType::F64] {
            let mut g = Graph::new();
            let x = g.input("x", [3, 5], dtype).unwrap();
            for f in [gelu_tanh, relu, softmax, log_softmax] {
                let y = f(&mut g, x).unwrap();
                assert_eq!(*g.ty(y), TensorType::new([3, 5], dtype));
            }
            g.verify().unwrap();
        }
    }

    #[test]
    fn embedding_gathers_rows_of_a_rows_by_dim_table() {
        let mut g = Graph::new();
        let ids = g.input("ids", [2, 3], DType::I64).unwrap();
        let y = embedding(&mut g, "wte", ids, 11, 4, DType::F32).unwrap();
        assert_eq!(*g.ty(y), TensorType::new([2, 3, 4], DType::F32));
        assert_eq!(
            params(&g),
            vec![("wte.weight".into(), Shape::new(&[11, 4]))]
        );
    }

    #[test]
    fn attention_maps_b_t_d_to_b_t_d_with_qkv_and_proj_parameters() {
        let mut g = Graph::new();
        let x = g.input("x", [2, 5, 12], DType::F64).unwrap();
        let y = causal_self_attention(&mut g, "attn", x, 3).unwrap();
        assert_eq!(*g.ty(y), TensorType::new([2, 5, 12], DType::F64));
        let names: Vec<String> = params(&g).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "attn.qkv.weight",
                "attn.qkv.bias",
                "attn.proj.weight",
                "attn.proj.bias"
            ]
        );
        assert_eq!(
            g.ty(g.leaf("attn.qkv.weight").unwrap()).shape,
            Shape::new(&[36, 12])
        );
        // The scores are [B, H, T, T]: the plain attention materializes them.
        assert!(g
            .nodes()
            .iter()
            .any(|n| matches!(n.op, Op::MatMul { .. }) && n.ty.shape == Shape::new(&[2, 3, 5, 5])));
        g.verify().unwrap();
    }

    #[test]
    fn attention_rejects_d_not_divisible_by_heads_naming_the_layer() {
        let mut g = Graph::new();
        let x = g.input("x", [2, 5, 10], DType::F32).unwrap();
        let e = causal_self_attention(&mut g, "blocks.3.attn", x, 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("blocks.3.attn") && e.contains("heads"), "{e}");
    }

    #[test]
    fn the_mask_value_is_finite_and_exactly_representable_in_its_dtype() {
        assert_eq!(mask_value(DType::F32) as f32, f32::MIN);
        assert!(mask_value(DType::F32).is_finite() && mask_value(DType::F64).is_finite());
    }

    #[test]
    fn cross_entropy_is_a_scalar_of_the_logits_dtype() {
        for (dtype, ids) in [(DType::F32, DType::I64), (DType::F64, DType::I32)] {
            let mut g = Graph::new();
            let logits = g.input("logits", [4, 10], dtype).unwrap();
            let y = g.input("y", [4], ids).unwrap();
            let loss = softmax_cross_entropy(&mut g, logits, y).unwrap();
            assert_eq!(*g.ty(loss), TensorType::new(Shape::scalar(), dtype));
            g.verify().unwrap();
        }
    }

    #[test]
    fn cross_entropy_rejects_mismatched_batch_sizes() {
        let mut g = Graph::new();
        let logits = g.input("logits", [4, 10], DType::F32).unwrap();
        let y = g.input("y", [5], DType::I64).unwrap();
        let e = softmax_cross_entropy(&mut g, logits, y)
            .unwrap_err()
            .to_string();
        assert!(e.contains("f32[4,10]") && e.contains("i64[5]"), "{e}");
    }
}
