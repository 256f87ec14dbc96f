//! The precision of a compiled step, and the bf16 mixed-precision policy as a graph pass.
//!
//! [`autocast_bf16`] rewrites a traced **forward** graph the way PyTorch's bf16 autocast runs
//! it, by inserting casts (`convert` nodes):
//! - matrix products take bf16 operands (weights and activations are cast where they feed a
//!   matmul) and give bf16 results (f32 accumulation is the kernels' business); so do
//!   convolutions, while max pooling keeps its operand's dtype;
//! - every reduction (the sums and maxes inside softmax, LayerNorm, the loss) takes an f32
//!   operand and gives f32, so softmax, LayerNorm and the loss compute in f32;
//! - an elementwise op computes in f32 if any of its *strong* float operands is f32, else in
//!   bf16 if one is bf16. Constants and leaves (parameters, inputs) are *weak*: they take the
//!   dtype of the values they meet (as a Python scalar does in PyTorch), so a bias added to a
//!   bf16 matmul result is cast to bf16 and the sum stays bf16, while a LayerNorm gain meets an
//!   f32 normalized value and stays f32. View ops (broadcast, reshape, transpose, slice) keep
//!   their operand's dtype and weakness;
//! - a batch norm gives its operand's dtype, as autocast's `batch_norm` does (it is on neither
//!   of autocast's lists): its statistics and arithmetic are f32, and its output is cast back to
//!   a bf16 operand's dtype, so that a ResNet's activations and residual stream are stored bf16
//!   as PyTorch stores them. A batch norm is recognized by its shape, not by a name
//!   ([`batch_norm_ends`]): `x − m` with `m` the same for every sample and channel-shaped, then
//!   any chain of `+ − · ÷` by such values. Normalizations within a sample (LayerNorm, whose
//!   statistics differ per sample) are not batch norms and stay f32, as autocast's `layer_norm`;
//! - leaves keep their dtype (parameters stay f32), and so does every output (the loss is f32);
//! - fused attention ([`Op::Attention`]) is treated as the matmuls it contains: q, k and v are
//!   cast to bf16 and its output is bf16, while its row log-sum-exp stays f32. Attention is
//!   recognized ([`crate::recognize`]) before this policy runs, so the policy sees one op, not
//!   the scores' matmul, scaling, mask and softmax.
//!
//! It runs **before autodiff**, on the forward graph, for two reasons. Autodiff then derives the
//! backward pass through the casts (the gradient of a cast is a cast back), so the backward
//! matmuls get bf16 operands and every parameter's gradient arrives in f32, with no second
//! policy for the backward ops. And the optimizer, which `training_step` appends after autodiff,
//! is never touched: parameters, their gradients as the optimizer sees them, AdamW's moments and
//! the update stay f32. Activations saved for the backward pass are what the forward computes,
//! so those that feed matmuls, and the matmul results, are stored bf16.
//!
//! A finite constant cast to bf16 saturates at bf16's largest finite magnitude instead of
//! rounding to infinity (`f32::MIN`, the attention mask value, is past bf16's range), so that
//! masked values stay finite as [`crate::trace::nn::mask_value`] intends.

use crate::error::IrError;
use crate::ir::{DType, Graph, NodeId, Op, TensorType};
use ingot_kernels::dtype::bf16;
use serde::{Deserialize, Serialize};

/// The arithmetic a compiled step uses: a choice made with the model (a model file's
/// `precision` line, the `precision` field of `model::Model`, or the command line), like its
/// optimizer; what each precision does to the step is this stage's business.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 everywhere: the reference.
    #[default]
    F32,
    /// f32 storage; the GPU's matrix products use TF32 tensor cores (a runtime choice: the
    /// graph is the f32 one).
    Tf32,
    /// bf16 mixed precision ([`autocast_bf16`]).
    Bf16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    pub fn from_name(s: &str) -> Option<Precision> {
        [Precision::F32, Precision::Tf32, Precision::Bf16]
            .into_iter()
            .find(|p| p.name() == s)
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `w` is a convolution (or one of its gradients) rather than pooling.
fn is_conv(w: &crate::ir::WindowOp) -> bool {
    use crate::ir::WindowOp as W;
    matches!(
        w,
        W::Conv2d(_) | W::Conv2dGradInput { .. } | W::Conv2dGradWeight { .. }
    )
}

impl Precision {
    /// The forward graph this precision trains: `g` itself for f32 and tf32, the autocast
    /// graph for bf16.
    pub fn apply(self, g: &Graph) -> Result<Graph, IrError> {
        match self {
            Precision::F32 | Precision::Tf32 => Ok(g.clone()),
            Precision::Bf16 => autocast_bf16(g),
        }
    }
}

/// The forward graph `g` under the bf16 policy (see the module docs). Only f32 values change
/// dtype; f64, integer and bool values are left as they are.
pub fn autocast_bf16(g: &Graph) -> Result<Graph, IrError> {
    let mut cx = Cx {
        out: Graph::new(),
        map: Vec::with_capacity(g.len()),
        weak: Vec::with_capacity(g.len()),
    };
    let ends = batch_norm_ends(g);
    for id in g.ids() {
        cx.out.set_scope(g.origin(id).clone()); // casts belong to the node they serve
        let (mut new, weak) = cx.node(g, id)?;
        if let Some(x) = ends[id.index()] {
            // A batch norm's f32 result back in its operand's dtype (a bf16 activation's).
            if cx.dtype(new) == DType::F32 && cx.dtype(cx.map[x.index()]) == DType::BF16 {
                new = cx.cast(new, DType::BF16)?;
            }
        }
        cx.map.push(new);
        cx.weak.push(weak);
    }
    let outputs: Vec<(String, NodeId)> = g.outputs.iter().map(|(k, &v)| (k.clone(), v)).collect();
    for (name, v) in outputs {
        let x = cx.cast(cx.map[v.index()], g.ty(v).dtype)?;
        cx.out.set_output(&name, x)?;
    }
    for u in &g.updates {
        let value = cx.cast(cx.map[u.value.index()], g.ty(u.value).dtype)?;
        cx.out.set_update(cx.map[u.target.index()], value)?;
    }
    Ok(cx.out)
}

/// For each node that ends a batch norm, the value it normalizes (`None` elsewhere).
///
/// A batch norm is found by shape: it starts at `x − m`, where `x` is `[N, C, ...]` and `m` is
/// *per-channel* (a broadcast of a value whose extents, aligned to `x`'s, are 1 except `C` on
/// axis 1: the batch's mean, or a running mean), and goes on through `+ − · ÷` by per-channel
/// values (`1/√(var + ε)`, the gain, the shift); it ends at a member no other member extends.
/// The same shape is what `trace::nn::batch_norm2d` and the ONNX importer's `BatchNormalization`
/// build, in training and evaluation modes alike. LayerNorm's statistics vary per sample (extent
/// `N` on axis 0), so it is never one.
pub fn batch_norm_ends(g: &Graph) -> Vec<Option<NodeId>> {
    use crate::ir::BinaryOp as B;
    let per_channel = |p: NodeId, of: NodeId| -> bool {
        let s = g.ty(of).shape.dims();
        let n = g.node(p);
        if s.len() < 2 || !matches!(n.op, Op::Broadcast) || g.ty(p).shape.dims() != s {
            return false;
        }
        let q = g.ty(n.inputs[0]).shape.dims();
        let lead = s.len().saturating_sub(q.len());
        (0..s.len()).all(|i| {
            let e = if i < lead { 1 } else { q[i - lead] };
            e == if i == 1 { s[1] } else { 1 }
        })
    };
    let mut source: Vec<Option<NodeId>> = vec![None; g.len()];
    let mut extended = vec![false; g.len()];
    for id in g.ids() {
        let n = g.node(id);
        let Op::Binary(op) = n.op else { continue };
        if !matches!(op, B::Add | B::Sub | B::Mul | B::Div) {
            continue;
        }
        let (a, b) = (n.inputs[0], n.inputs[1]);
        let from = if let Some(x) = source[a.index()].filter(|_| per_channel(b, a)) {
            extended[a.index()] = true;
            Some(x)
        } else if let Some(x) =
            source[b.index()].filter(|_| matches!(op, B::Add | B::Mul) && per_channel(a, b))
        {
            extended[b.index()] = true;
            Some(x)
        } else if op == B::Sub && per_channel(b, a) && !matches!(g.node(a).op, Op::Broadcast) {
            Some(a)
        } else {
            None
        };
        source[id.index()] = from;
    }
    source
        .into_iter()
        .zip(extended)
        .map(|(x, more)| x.filter(|_| !more))
        .collect()
}

struct Cx {
    out: Graph,
    /// New node of each old node.
    map: Vec<NodeId>,
    /// Whether each old node's value is weak (a constant or a leaf, possibly viewed).
    weak: Vec<bool>,
}

impl Cx {
    fn dtype(&self, new: NodeId) -> DType {
        self.out.ty(new).dtype
    }

    /// `x` (a new node) as `dtype`: itself, a new constant for a constant, or a cast.
    fn cast(&mut self, x: NodeId, dtype: DType) -> Result<NodeId, IrError> {
        if self.dtype(x) == dtype {
            return Ok(x);
        }
        if let Op::Full { value } = self.out.node(x).op {
            let value = if dtype == DType::BF16 && value.is_finite() {
                let max = bf16::MAX.to_f64();
                value.clamp(-max, max)
            } else {
                value
            };
            let shape = self.out.ty(x).shape.clone();
            return self.out.full(value, shape, dtype);
        }
        self.out.convert(x, dtype)
    }

    /// The dtype an elementwise op over the (old) operands `xs` computes in: f32 if a strong
    /// operand is f32, else bf16 if any operand is bf16; `None` when the op is not an f32/bf16
    /// op (it is left alone).
    fn unify(&self, g: &Graph, xs: &[NodeId]) -> Option<DType> {
        let floats: Vec<NodeId> = xs
            .iter()
            .copied()
            .filter(|x| matches!(g.ty(*x).dtype, DType::F32))
            .collect();
        if floats.is_empty() {
            return None;
        }
        let new = |x: NodeId| self.dtype(self.map[x.index()]);
        if floats
            .iter()
            .any(|&x| !self.weak[x.index()] && new(x) == DType::F32)
        {
            Some(DType::F32)
        } else if floats.iter().any(|&x| new(x) == DType::BF16) {
            Some(DType::BF16)
        } else {
            Some(DType::F32)
        }
    }

    /// The new node of old node `id`, and whether it is weak.
    fn node(&mut self, g: &Graph, id: NodeId) -> Result<(NodeId, bool), IrError> {
        let n = g.node(id);
        let old: Vec<NodeId> = n.inputs.to_vec();
        let mapped: Vec<NodeId> = old.iter().map(|x| self.map[x.index()]).collect();
        let f32_node = n.ty.dtype == DType::F32;
        let push = |cx: &mut Cx, inputs: &[NodeId], dtype: DType| {
            let ty = TensorType::new(n.ty.shape.clone(), dtype);
            cx.out.push(n.op.clone(), inputs, Some(ty))
        };
        Ok(match &n.op {
            Op::Result { .. } if g.node(old[0]).op.is_attention() => {
                // An attention's extra output takes the type its (new) writer gives it.
                (
                    self.out.output_of(
                        mapped[0],
                        match n.op {
                            Op::Result { index } => index,
                            _ => unreachable!(),
                        },
                    )?,
                    false,
                )
            }
            Op::Fused(_) | Op::Result { .. } => {
                return Err(IrError::Invalid(
                    "the precision policy runs on the traced forward graph, before fusion".into(),
                ))
            }
            // Attention is a matmul pair: q, k, v (and out, dout) in bf16, out bf16; its lse
            // stays f32 (the op's definition).
            Op::Attention { .. } | Op::AttentionGrad { .. } if f32_node => {
                let mut ins = mapped.clone();
                for (k, x) in ins.iter_mut().enumerate() {
                    // attention_grad's operand 4 is the lse: f32 always.
                    if !(matches!(n.op, Op::AttentionGrad { .. }) && k == 4) {
                        *x = self.cast(*x, DType::BF16)?;
                    }
                }
                (self.out.push(n.op.clone(), &ins, None)?, false)
            }
            Op::Leaf { .. } => (push(self, &[], n.ty.dtype)?, true),
            Op::Full { .. } => (push(self, &[], n.ty.dtype)?, true),
            // A convolution is a matrix product: bf16 operands, a bf16 result (as autocast's
            // conv2d). Max pooling picks values, so it keeps its operand's dtype.
            Op::Window(w) if f32_node => {
                let to = if is_conv(w) {
                    DType::BF16
                } else {
                    self.dtype(mapped[0])
                };
                let mut ins = Vec::with_capacity(mapped.len());
                for &x in &mapped {
                    ins.push(self.cast(x, to)?);
                }
                (push(self, &ins, to)?, false)
            }
            Op::MatMul { .. } if f32_node => {
                let a = self.cast(mapped[0], DType::BF16)?;
                let b = self.cast(mapped[1], DType::BF16)?;
                (push(self, &[a, b], DType::BF16)?, false)
            }
            Op::Reduce { .. } if f32_node => {
                let x = self.cast(mapped[0], DType::F32)?;
                (push(self, &[x], DType::F32)?, false)
            }
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Concat { .. } => {
                // Select's condition (operand 0) is bool and never cast.
                let first = usize::from(matches!(n.op, Op::Select));
                match self.unify(g, &old[first..]) {
                    Some(t) => {
                        let mut ins = mapped.clone();
                        for (k, x) in ins.iter_mut().enumerate().skip(first) {
                            if g.ty(old[k]).dtype == DType::F32 {
                                *x = self.cast(*x, t)?;
                            }
                        }
                        let dtype = if matches!(n.op, Op::Compare(_)) {
                            DType::Bool
                        } else {
                            t
                        };
                        let weak = old[first..].iter().all(|x| self.weak[x.index()]);
                        (push(self, &ins, dtype)?, weak)
                    }
                    None => (push(self, &mapped, n.ty.dtype)?, false),
                }
            }
            Op::Broadcast
            | Op::Reshape
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::StopGradient => {
                let d = self.dtype(mapped[0]);
                (push(self, &mapped, d)?, self.weak[old[0].index()])
            }
            // Dropout keeps its operand's dtype (autocast's dropout runs in the input's).
            Op::Gather | Op::Dropout { .. } => {
                let d = self.dtype(mapped[0]);
                (push(self, &mapped, d)?, false)
            }
            Op::ScatterAdd { .. } => {
                let d = self.dtype(mapped[1]);
                (push(self, &mapped, d)?, false)
            }
            // Iota, conversions, and f64/integer matmuls and reductions keep their dtype.
            _ => (push(self, &mapped, n.ty.dtype)?, false),
        })
    }
}
