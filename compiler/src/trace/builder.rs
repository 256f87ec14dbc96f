//! The tracing API: one method per primitive on [`Graph`], with NumPy broadcasting inserted as
//! explicit `broadcast` nodes, so model code reads like array code while the graph stays
//! made of strict primitives. Every method returns an error naming the op and shapes on misuse.

use crate::error::{IrError, Result};
use crate::ir::{
    AttentionLayout, Axes, BinaryOp, CmpOp, DType, Graph, Init, LeafKind, NodeId, Op, ReduceOp,
    Shape, TensorType, UnaryOp,
};
use smallvec::SmallVec;

/// Methods named for one op of a family: `neg(a)` is `unary(UnaryOp::Neg, a)`, `add(a, b)` is
/// `binary(BinaryOp::Add, a, b)`. One line per op rather than three, so that the list reads as
/// the table it is.
macro_rules! shortcuts {
    (unary: $($name:ident $variant:ident),* $(,)?) => {
        $(
            #[doc = concat!("`unary(UnaryOp::", stringify!($variant), ", a)`.")]
            pub fn $name(&mut self, a: NodeId) -> Result<NodeId> {
                self.unary(UnaryOp::$variant, a)
            }
        )*
    };
    (binary: $($name:ident $variant:ident),* $(,)?) => {
        $(
            #[doc = concat!("`binary(BinaryOp::", stringify!($variant), ", a, b)`.")]
            pub fn $name(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
                self.binary(BinaryOp::$variant, a, b)
            }
        )*
    };
}

impl Graph {
    fn add_leaf(
        &mut self,
        kind: LeafKind,
        name: &str,
        shape: impl Into<Shape>,
        dtype: DType,
        init: Init,
    ) -> Result<NodeId> {
        self.push(
            Op::Leaf {
                kind,
                name: name.to_string(),
                init,
            },
            &[],
            Some(TensorType::new(shape, dtype)),
        )
    }

    /// A trainable parameter, initialised by `init` when no weights are given.
    pub fn parameter(
        &mut self,
        name: &str,
        shape: impl Into<Shape>,
        dtype: DType,
        init: Init,
    ) -> Result<NodeId> {
        self.add_leaf(LeafKind::Parameter, name, shape, dtype, init)
    }

    /// Optimizer state (zero-initialised unless `init` says otherwise).
    pub fn state(
        &mut self,
        name: &str,
        shape: impl Into<Shape>,
        dtype: DType,
        init: Init,
    ) -> Result<NodeId> {
        self.add_leaf(LeafKind::State, name, shape, dtype, init)
    }

    /// A step input, written by the host before each step.
    pub fn input(&mut self, name: &str, shape: impl Into<Shape>, dtype: DType) -> Result<NodeId> {
        self.add_leaf(LeafKind::Input, name, shape, dtype, Init::Zeros)
    }

    /// An integer step input whose ids lie in `0..bound` ([`Init::Ids`]: labels whose class
    /// count no parameter shows).
    pub fn ids_input(
        &mut self,
        name: &str,
        shape: impl Into<Shape>,
        dtype: DType,
        bound: u64,
    ) -> Result<NodeId> {
        self.add_leaf(LeafKind::Input, name, shape, dtype, Init::Ids { bound })
    }

    /// A constant tensor.
    pub fn full(&mut self, value: f64, shape: impl Into<Shape>, dtype: DType) -> Result<NodeId> {
        self.push(Op::Full { value }, &[], Some(TensorType::new(shape, dtype)))
    }

    /// A constant with the shape and dtype of `like`.
    pub fn full_like(&mut self, value: f64, like: NodeId) -> Result<NodeId> {
        let t = self.ty(like).clone();
        self.push(Op::Full { value }, &[], Some(t))
    }

    /// Each element's index along `axis`.
    pub fn iota(&mut self, shape: impl Into<Shape>, axis: usize, dtype: DType) -> Result<NodeId> {
        self.push(Op::Iota { axis }, &[], Some(TensorType::new(shape, dtype)))
    }

    /// The `dropout` primitive ([`Op::Dropout`]): `x` with the elements the draw of
    /// `(seed, salt, index)` drops zeroed and the rest scaled by `1/(1 − p)`, in every mode (the
    /// layer, [`crate::trace::nn::dropout`], is the identity in evaluation mode).
    pub fn dropout_mask(&mut self, x: NodeId, seed: NodeId, p: f64, salt: u64) -> Result<NodeId> {
        self.push(Op::Dropout { p, salt }, &[x, seed], None)
    }

    pub fn unary(&mut self, op: UnaryOp, a: NodeId) -> Result<NodeId> {
        self.push(Op::Unary(op), &[a], None)
    }

    shortcuts! {
        unary: neg Neg, exp Exp, log Log, sqrt Sqrt, tanh Tanh, recip Recip
    }

    /// The NumPy broadcast of the shapes of `a` and `b`, or an error naming `op` and both.
    pub fn broadcast_shape(&self, op: &'static str, a: NodeId, b: NodeId) -> Result<Shape> {
        broadcast_shapes(&self.ty(a).shape, &self.ty(b).shape).map_err(|reason| IrError::Type {
            op,
            node: self.len(),
            operands: format!("{}, {}", self.ty(a), self.ty(b)),
            reason,
        })
    }

    /// `a` broadcast to `shape` (no node is added when it already has that shape).
    pub fn broadcast_to(&mut self, a: NodeId, shape: impl Into<Shape>) -> Result<NodeId> {
        let shape = shape.into();
        if self.ty(a).shape == shape {
            return Ok(a);
        }
        let dtype = self.ty(a).dtype;
        self.push(Op::Broadcast, &[a], Some(TensorType::new(shape, dtype)))
    }

    fn broadcast_pair(
        &mut self,
        op: &'static str,
        a: NodeId,
        b: NodeId,
    ) -> Result<(NodeId, NodeId)> {
        let s = self.broadcast_shape(op, a, b)?;
        Ok((self.broadcast_to(a, s.clone())?, self.broadcast_to(b, s)?))
    }

    /// An elementwise binary op with NumPy broadcasting.
    pub fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        let name = Op::Binary(op).name();
        let (a, b) = self.broadcast_pair(name, a, b)?;
        self.push(Op::Binary(op), &[a, b], None)
    }

    shortcuts! {
        binary: add Add, sub Sub, mul Mul, div Div, maximum Max, minimum Min
    }

    /// `a op c` for a scalar constant `c` of `a`'s dtype.
    pub fn binary_scalar(&mut self, op: BinaryOp, a: NodeId, c: f64) -> Result<NodeId> {
        let k = self.full_like(c, a)?;
        self.push(Op::Binary(op), &[a, k], None)
    }
    pub fn add_scalar(&mut self, a: NodeId, c: f64) -> Result<NodeId> {
        self.binary_scalar(BinaryOp::Add, a, c)
    }
    pub fn mul_scalar(&mut self, a: NodeId, c: f64) -> Result<NodeId> {
        self.binary_scalar(BinaryOp::Mul, a, c)
    }

    /// Elementwise comparison with broadcasting; the result is `bool`.
    pub fn compare(&mut self, op: CmpOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        let name = Op::Compare(op).name();
        let (a, b) = self.broadcast_pair(name, a, b)?;
        self.push(Op::Compare(op), &[a, b], None)
    }

    /// `a` where `cond`, else `b`, all broadcast to one shape.
    pub fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId> {
        let s = self.broadcast_shape("select", a, b)?;
        let s = broadcast_shapes(&self.ty(cond).shape, &s).map_err(|reason| IrError::Type {
            op: "select",
            node: self.len(),
            operands: format!("{}, {}, {}", self.ty(cond), self.ty(a), self.ty(b)),
            reason,
        })?;
        let (c, a, b) = (
            self.broadcast_to(cond, s.clone())?,
            self.broadcast_to(a, s.clone())?,
            self.broadcast_to(b, s)?,
        );
        self.push(Op::Select, &[c, a, b], None)
    }

    /// Same elements, new shape (no node is added when the shape is unchanged).
    pub fn reshape(&mut self, a: NodeId, shape: impl Into<Shape>) -> Result<NodeId> {
        let shape = shape.into();
        if self.ty(a).shape == shape {
            return Ok(a);
        }
        let dtype = self.ty(a).dtype;
        self.push(Op::Reshape, &[a], Some(TensorType::new(shape, dtype)))
    }

    /// Output axis `i` is operand axis `perm[i]`.
    pub fn transpose(&mut self, a: NodeId, perm: &[usize]) -> Result<NodeId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) && perm.len() == self.ty(a).shape.rank() {
            return Ok(a);
        }
        self.push(
            Op::Transpose {
                perm: Axes::from_slice(perm),
            },
            &[a],
            None,
        )
    }

    /// Swaps the last two axes.
    pub fn transpose_last(&mut self, a: NodeId) -> Result<NodeId> {
        let r = self.ty(a).shape.rank();
        if r < 2 {
            return Err(IrError::Type {
                op: "transpose",
                node: self.len(),
                operands: self.ty(a).to_string(),
                reason: "needs at least two axes".into(),
            });
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.transpose(a, &perm)
    }

    pub fn slice(&mut self, a: NodeId, axis: usize, start: usize, end: usize) -> Result<NodeId> {
        self.push(Op::Slice { axis, start, end }, &[a], None)
    }

    pub fn concat(&mut self, parts: &[NodeId], axis: usize) -> Result<NodeId> {
        self.push(Op::Concat { axis }, parts, None)
    }

    pub fn reduce(&mut self, op: ReduceOp, a: NodeId, axes: &[usize]) -> Result<NodeId> {
        self.push(
            Op::Reduce {
                op,
                axes: Axes::from_slice(axes),
            },
            &[a],
            None,
        )
    }

    /// Sum over `axes`, keeping them as size 1.
    pub fn sum(&mut self, a: NodeId, axes: &[usize]) -> Result<NodeId> {
        self.reduce(ReduceOp::Sum, a, axes)
    }

    /// Max over `axes`, keeping them as size 1.
    pub fn max(&mut self, a: NodeId, axes: &[usize]) -> Result<NodeId> {
        self.reduce(ReduceOp::Max, a, axes)
    }

    /// Mean over `axes`, keeping them as size 1.
    pub fn mean(&mut self, a: NodeId, axes: &[usize]) -> Result<NodeId> {
        let s = self.sum(a, axes)?;
        let n: usize = axes
            .iter()
            .map(|&x| self.ty(a).shape.dims().get(x).copied().unwrap_or(1))
            .product();
        self.mul_scalar(s, 1.0 / n as f64)
    }

    /// Sum of every element, as a scalar.
    pub fn sum_all(&mut self, a: NodeId) -> Result<NodeId> {
        let r = self.ty(a).shape.rank();
        if r == 0 {
            return Ok(a);
        }
        let axes: Vec<usize> = (0..r).collect();
        let s = self.sum(a, &axes)?;
        self.reshape(s, Shape::scalar())
    }

    pub fn matmul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.push(Op::MATMUL, &[a, b], None)
    }

    /// `matmul` reading `a` (`b`) with its last two axes swapped when `ta` (`tb`).
    pub fn matmul_t(&mut self, a: NodeId, b: NodeId, ta: bool, tb: bool) -> Result<NodeId> {
        self.push(Op::MatMul { ta, tb }, &[a, b], None)
    }

    /// `c + a·b`, the product of `a` and `b` (read transposed where `ta`, `tb`) accumulated
    /// into `c` ([`Op::MatMulAcc`]).
    pub fn matmul_acc(
        &mut self,
        c: NodeId,
        a: NodeId,
        b: NodeId,
        ta: bool,
        tb: bool,
    ) -> Result<NodeId> {
        self.push(Op::MatMulAcc { ta, tb }, &[c, a, b], None)
    }

    /// The same value, with no gradient flowing back through it.
    pub fn stop_gradient(&mut self, a: NodeId) -> Result<NodeId> {
        self.push(Op::StopGradient, &[a], None)
    }

    pub fn gather(&mut self, table: NodeId, ids: NodeId) -> Result<NodeId> {
        self.push(Op::Gather, &[table, ids], None)
    }

    pub fn scatter_add(&mut self, ids: NodeId, values: NodeId, rows: usize) -> Result<NodeId> {
        self.push(Op::ScatterAdd { rows }, &[ids, values], None)
    }

    /// A cast: [`Graph::convert`] under the name mixed-precision code uses
    /// (`g.cast(x, DType::BF16)`). Its gradient is a cast back to `x`'s dtype.
    pub fn cast(&mut self, a: NodeId, dtype: DType) -> Result<NodeId> {
        self.convert(a, dtype)
    }

    /// Elementwise conversion (no node is added when the dtype is unchanged).
    pub fn convert(&mut self, a: NodeId, dtype: DType) -> Result<NodeId> {
        if self.ty(a).dtype == dtype {
            return Ok(a);
        }
        let shape = self.ty(a).shape.clone();
        self.push(Op::Convert, &[a], Some(TensorType::new(shape, dtype)))
    }

    /// Fused attention `softmax(scale · q·kᵀ [causal]) · v` ([`Op::Attention`]) in the heads'
    /// layout: `q [.., Tq, D]`, `k` and `v [.., Tk, D]` give `out [.., Tq, D]`. Its row
    /// log-sum-exps are [`Graph::output_of`]`(out, 1)`; autodiff differentiates it with
    /// [`Op::AttentionGrad`] ([`Graph::attention_grad`]).
    pub fn attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        causal: bool,
        scale: f64,
    ) -> Result<NodeId> {
        self.attention_in(AttentionLayout::Heads, &[q, k, v], causal, scale)
    }

    /// Fused attention over `operands` laid out as `layout` says (q, k, v; or one packed qkv).
    pub fn attention_in(
        &mut self,
        layout: AttentionLayout,
        operands: &[NodeId],
        causal: bool,
        scale: f64,
    ) -> Result<NodeId> {
        self.push(
            Op::Attention {
                causal,
                scale,
                layout,
            },
            operands,
            None,
        )
    }

    /// The backward pass of attention node `forward` given the gradient `dout` of its output:
    /// the gradient of each of its operands, in their order.
    pub fn attention_grad(
        &mut self,
        forward: NodeId,
        dout: NodeId,
    ) -> Result<SmallVec<[NodeId; 3]>> {
        let f = self.node(forward).clone();
        let Op::Attention {
            causal,
            scale,
            layout,
        } = f.op
        else {
            return Err(IrError::Type {
                op: "attention_grad",
                node: self.len(),
                operands: self.ty(forward).to_string(),
                reason: format!("node {} is a {}, not an attention", forward.0, f.op.name()),
            });
        };
        let lse = self.output_of(forward, 1)?;
        let mut operands: SmallVec<[NodeId; 6]> = f.inputs.iter().copied().collect();
        operands.extend([forward, lse, dout]);
        let first = self.push(
            Op::AttentionGrad {
                causal,
                scale,
                layout,
            },
            &operands,
            None,
        )?;
        (0..f.inputs.len())
            .map(|i| self.output_of(first, i))
            .collect()
    }

    /// Output `index` of the multi-output node `node` (an attention op): the existing
    /// [`Op::Result`] node naming it, or a new one. Index 0 is `node` itself.
    pub fn output_of(&mut self, node: NodeId, index: usize) -> Result<NodeId> {
        if index == 0 {
            return Ok(node);
        }
        let n = self.node(node);
        let op_name = n.op.name();
        let types = {
            let operands: SmallVec<[&TensorType; 6]> =
                n.inputs.iter().map(|&x| self.ty(x)).collect();
            crate::ir::attention_outputs(&n.op, &operands)
        };
        let types = types.map_err(|reason| IrError::Type {
            op: "result",
            node: self.len(),
            operands: self.ty(node).to_string(),
            reason: format!("output {index} of {node}: {reason}"),
        })?;
        let Some(ty) = types.get(index).cloned() else {
            return Err(IrError::Invalid(format!(
                "{node} ({op_name}) has {} outputs, not {}",
                types.len(),
                index + 1
            )));
        };
        match self.result_of(node, index) {
            Some(r) => Ok(r),
            None => self.push(Op::Result { index }, &[node], Some(ty)),
        }
    }
}

/// The NumPy broadcast of two shapes: axes align to the right, and each pair is equal or has a 1.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> std::result::Result<Shape, String> {
    let (sa, sb) = (a.dims(), b.dims());
    let rank = sa.len().max(sb.len());
    let mut out: SmallVec<[usize; 4]> = SmallVec::from_elem(1, rank);
    for i in 0..rank {
        let da = if i + sa.len() >= rank {
            sa[i + sa.len() - rank]
        } else {
            1
        };
        let db = if i + sb.len() >= rank {
            sb[i + sb.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(format!(
                    "shapes {a} and {b} do not broadcast: axis {i} has sizes {da} and {db}"
                ))
            }
        };
    }
    Ok(Shape(out))
}
