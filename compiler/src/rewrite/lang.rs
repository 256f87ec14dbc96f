//! The e-graph's language: one e-node per IR op, with the op's attributes held in a form that is
//! `Eq + Ord + Hash` (floats by their bits), as egg's [`egg::Language`] requires.
//!
//! An e-node is an operator ([`Kind`]) and its operand e-classes. Ops whose result type is not a
//! function of their operands carry what is missing: `full` and `iota` their whole type,
//! `broadcast` and `reshape` their target shape, `convert` its target dtype. A leaf is named by
//! its position among the input graph's leaves, so two leaves never hash-cons together even when
//! their types are equal.

use crate::error::IrError;
use crate::ir::{
    infer, AttentionLayout, Axes, BinaryOp, CmpOp, DType, Op, ReduceOp, Shape, TensorType, UnaryOp,
    WindowOp,
};
use egg::Id;
use smallvec::SmallVec;
use std::fmt;

/// Dimension sizes, permutations and axis lists.
pub type Dims = SmallVec<[usize; 4]>;

/// A tensor type that can be ordered and hashed (the IR's [`TensorType`] is not `Ord`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ty {
    pub dtype: DType,
    pub dims: Dims,
}

impl Ty {
    pub fn of(t: &TensorType) -> Ty {
        Ty {
            dtype: t.dtype,
            dims: t.shape.0.clone(),
        }
    }

    pub fn tensor_type(&self) -> TensorType {
        TensorType {
            shape: Shape(self.dims.clone()),
            dtype: self.dtype,
        }
    }
}

/// The operator of an e-node, with its attributes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// The input graph's leaf number `n` (counting leaves only, in graph order).
    Leaf(u32),
    /// A constant; `bits` is the f64 value's bit pattern.
    Full {
        bits: u64,
        ty: Ty,
    },
    Iota {
        axis: usize,
        ty: Ty,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CmpOp),
    Select,
    /// To this shape (the dtype is the operand's).
    Broadcast(Dims),
    /// To this shape (the dtype is the operand's).
    Reshape(Dims),
    /// By this permutation.
    Transpose(Dims),
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    Concat(usize),
    Reduce(ReduceOp, Dims),
    MatMul {
        ta: bool,
        tb: bool,
    },
    /// `c + a·b` (opaque to the rules: fusion forms it after rewriting).
    MatMulAcc {
        ta: bool,
        tb: bool,
    },
    Gather,
    /// Into this many rows, summed in this dtype (the values' own, or f32 for bf16 values).
    ScatterAdd(usize, DType),
    /// To this dtype (the shape is the operand's).
    Convert(DType),
    StopGradient,
    /// Fused attention; `scale_bits` is the f64 scale's bit pattern.
    Attention {
        causal: bool,
        scale_bits: u64,
        layout: AttentionLayout,
    },
    AttentionGrad {
        causal: bool,
        scale_bits: u64,
        layout: AttentionLayout,
    },
    /// Output `index` of its operand, a multi-output op (an attention op), of type `ty`.
    Output {
        index: usize,
        ty: Ty,
    },
    /// Convolution and pooling (their attributes are plain integers).
    Window(WindowOp),
    /// Data parallelism's all-reduce of a bucket over this many ranks (opaque to the rules).
    AllReduce(usize),
    /// Data parallelism's all-gather over this many ranks (opaque to the rules).
    AllGather(usize),
    /// Data parallelism's reduce-scatter of a bucket over this many ranks (opaque to the rules).
    ReduceScatter(usize),
    /// Dropout; `p_bits` is the f64 probability's bit pattern (opaque to the rules).
    Dropout {
        p_bits: u64,
        salt: u64,
    },
}

impl Kind {
    /// One bit naming this kind's variant (binary ops by op, `neg` apart from the other unary
    /// ops), for [`super::index`]: a rule names the bits a class must hold for it to match.
    pub fn tag(&self) -> u64 {
        let bit = match self {
            Kind::Leaf(_) => 0,
            Kind::Full { .. } => 1,
            Kind::Iota { .. } => 2,
            Kind::Unary(UnaryOp::Neg) => 3,
            Kind::Unary(_) => 4,
            Kind::Binary(BinaryOp::Add) => 5,
            Kind::Binary(BinaryOp::Sub) => 6,
            Kind::Binary(BinaryOp::Mul) => 7,
            Kind::Binary(BinaryOp::Div) => 8,
            Kind::Binary(BinaryOp::Max | BinaryOp::Min) => 9,
            Kind::Compare(_) => 10,
            Kind::Select => 11,
            Kind::Broadcast(_) => 12,
            Kind::Reshape(_) => 13,
            Kind::Transpose(_) => 14,
            Kind::Slice { .. } => 15,
            Kind::Concat(_) => 16,
            Kind::Reduce(..) => 17,
            Kind::MatMul { .. } => 18,
            Kind::MatMulAcc { .. } => 19,
            Kind::Gather => 20,
            Kind::ScatterAdd(..) => 21,
            Kind::Convert(_) => 22,
            Kind::StopGradient => 23,
            Kind::Attention { .. } => 24,
            Kind::AttentionGrad { .. } => 25,
            Kind::Output { .. } => 26,
            Kind::Window(_) => 27,
            Kind::AllReduce(_) => 28,
            Kind::AllGather(_) => 29,
            Kind::ReduceScatter(_) => 30,
            Kind::Dropout { .. } => 31,
        };
        1 << bit
    }

    pub fn full(value: f64, ty: Ty) -> Kind {
        Kind::Full {
            bits: value.to_bits(),
            ty,
        }
    }

    /// The IR op this kind stands for and, for ops that need one, the result type to declare
    /// (computed from the operand types). `None` for leaves: their op lives in the input graph.
    pub fn to_op(&self, operands: &[&TensorType]) -> Option<(Op, Option<TensorType>)> {
        let first = operands.first();
        let with_dims = |dims: &Dims| {
            first.map(|t| TensorType {
                shape: Shape(dims.clone()),
                dtype: t.dtype,
            })
        };
        Some(match self {
            Kind::Leaf(_) => return None,
            Kind::Full { bits, ty } => (
                Op::Full {
                    value: f64::from_bits(*bits),
                },
                Some(ty.tensor_type()),
            ),
            Kind::Iota { axis, ty } => (Op::Iota { axis: *axis }, Some(ty.tensor_type())),
            Kind::Unary(u) => (Op::Unary(*u), None),
            Kind::Binary(b) => (Op::Binary(*b), None),
            Kind::Compare(c) => (Op::Compare(*c), None),
            Kind::Select => (Op::Select, None),
            Kind::Broadcast(dims) => (Op::Broadcast, with_dims(dims)),
            Kind::Reshape(dims) => (Op::Reshape, with_dims(dims)),
            Kind::Transpose(perm) => (
                Op::Transpose {
                    perm: Axes::from_slice(perm),
                },
                None,
            ),
            Kind::Slice { axis, start, end } => (
                Op::Slice {
                    axis: *axis,
                    start: *start,
                    end: *end,
                },
                None,
            ),
            Kind::Concat(axis) => (Op::Concat { axis: *axis }, None),
            Kind::Reduce(op, axes) => (
                Op::Reduce {
                    op: *op,
                    axes: Axes::from_slice(axes),
                },
                None,
            ),
            Kind::MatMul { ta, tb } => (Op::MatMul { ta: *ta, tb: *tb }, None),
            Kind::MatMulAcc { ta, tb } => (Op::MatMulAcc { ta: *ta, tb: *tb }, None),
            Kind::Gather => (Op::Gather, None),
            Kind::ScatterAdd(rows, dtype) => {
                // The result type, declared where it is wider than the values'.
                let declared = match operands {
                    [ids, vals] if vals.dtype != *dtype => {
                        let k = ids.shape.rank().min(vals.shape.rank());
                        let mut dims = Dims::new();
                        dims.push(*rows);
                        dims.extend_from_slice(&vals.shape.dims()[k..]);
                        Some(TensorType {
                            shape: Shape(dims),
                            dtype: *dtype,
                        })
                    }
                    _ => None,
                };
                (Op::ScatterAdd { rows: *rows }, declared)
            }
            Kind::Convert(dtype) => (
                Op::Convert,
                first.map(|t| TensorType {
                    shape: t.shape.clone(),
                    dtype: *dtype,
                }),
            ),
            Kind::StopGradient => (Op::StopGradient, None),
            Kind::Attention {
                causal,
                scale_bits,
                layout,
            } => (
                Op::Attention {
                    causal: *causal,
                    scale: f64::from_bits(*scale_bits),
                    layout: *layout,
                },
                None,
            ),
            Kind::AttentionGrad {
                causal,
                scale_bits,
                layout,
            } => (
                Op::AttentionGrad {
                    causal: *causal,
                    scale: f64::from_bits(*scale_bits),
                    layout: *layout,
                },
                None,
            ),
            Kind::Output { index, ty } => (Op::Result { index: *index }, Some(ty.tensor_type())),
            Kind::Window(w) => (Op::Window(*w), None),
            Kind::AllReduce(ranks) => (Op::AllReduce { ranks: *ranks }, None),
            Kind::AllGather(ranks) => (Op::AllGather { ranks: *ranks }, None),
            Kind::ReduceScatter(ranks) => (Op::ReduceScatter { ranks: *ranks }, None),
            Kind::Dropout { p_bits, salt } => (
                Op::Dropout {
                    p: f64::from_bits(*p_bits),
                    salt: *salt,
                },
                None,
            ),
        })
    }

    /// The kind of a non-leaf IR op, given its result type; `None` for ops the rewriter does
    /// not take (leaves, which the caller numbers, and the fusion pass's `fused`). A `result`
    /// is taken as the output of its operand (the caller refuses those of fused kernels).
    pub fn from_op(op: &Op, ty: &TensorType) -> Option<Kind> {
        Some(match op {
            Op::Leaf { .. } | Op::Fused(_) => return None,
            Op::Result { index } => Kind::Output {
                index: *index,
                ty: Ty::of(ty),
            },
            Op::Attention {
                causal,
                scale,
                layout,
            } => Kind::Attention {
                causal: *causal,
                scale_bits: scale.to_bits(),
                layout: *layout,
            },
            Op::AttentionGrad {
                causal,
                scale,
                layout,
            } => Kind::AttentionGrad {
                causal: *causal,
                scale_bits: scale.to_bits(),
                layout: *layout,
            },
            Op::Full { value } => Kind::full(*value, Ty::of(ty)),
            Op::Iota { axis } => Kind::Iota {
                axis: *axis,
                ty: Ty::of(ty),
            },
            Op::Unary(u) => Kind::Unary(*u),
            Op::Binary(b) => Kind::Binary(*b),
            Op::Compare(c) => Kind::Compare(*c),
            Op::Select => Kind::Select,
            Op::Broadcast => Kind::Broadcast(ty.shape.0.clone()),
            Op::Reshape => Kind::Reshape(ty.shape.0.clone()),
            Op::Transpose { perm } => Kind::Transpose(Dims::from_slice(perm)),
            Op::Slice { axis, start, end } => Kind::Slice {
                axis: *axis,
                start: *start,
                end: *end,
            },
            Op::Concat { axis } => Kind::Concat(*axis),
            Op::Reduce { op, axes } => Kind::Reduce(*op, Dims::from_slice(axes)),
            Op::MatMul { ta, tb } => Kind::MatMul { ta: *ta, tb: *tb },
            Op::MatMulAcc { ta, tb } => Kind::MatMulAcc { ta: *ta, tb: *tb },
            Op::Gather => Kind::Gather,
            Op::ScatterAdd { rows } => Kind::ScatterAdd(*rows, ty.dtype),
            Op::Convert => Kind::Convert(ty.dtype),
            Op::StopGradient => Kind::StopGradient,
            Op::Window(w) => Kind::Window(*w),
            Op::AllReduce { ranks } => Kind::AllReduce(*ranks),
            Op::AllGather { ranks } => Kind::AllGather(*ranks),
            Op::ReduceScatter { ranks } => Kind::ReduceScatter(*ranks),
            Op::Dropout { p, salt } => Kind::Dropout {
                p_bits: p.to_bits(),
                salt: *salt,
            },
        })
    }

    /// The result type of this kind applied to operands of these types, checked by
    /// [`infer`]; `leaf_types` holds the types of the input graph's leaves.
    pub fn result_type(
        &self,
        operands: &[&TensorType],
        leaf_types: &[TensorType],
    ) -> Result<TensorType, IrError> {
        if let Kind::Leaf(n) = self {
            return leaf_types
                .get(*n as usize)
                .cloned()
                .ok_or_else(|| IrError::Invalid(format!("rewrite: no leaf number {n}")));
        }
        match self.to_op(operands) {
            Some((op, declared)) => infer(&op, operands, declared.as_ref(), 0),
            None => Err(IrError::Invalid(format!("rewrite: {self:?} has no op"))),
        }
    }
}

/// An e-node: an operator and its operand e-classes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ENode {
    pub kind: Kind,
    pub args: SmallVec<[Id; 3]>,
}

impl ENode {
    pub fn new(kind: Kind, args: &[Id]) -> ENode {
        ENode {
            kind,
            args: SmallVec::from_slice(args),
        }
    }

    pub fn leaf(kind: Kind) -> ENode {
        ENode {
            kind,
            args: SmallVec::new(),
        }
    }
}

impl egg::Language for ENode {
    type Discriminant = std::mem::Discriminant<Kind>;

    fn discriminant(&self) -> Self::Discriminant {
        std::mem::discriminant(&self.kind)
    }

    fn matches(&self, other: &Self) -> bool {
        self.kind == other.kind && self.args.len() == other.args.len()
    }

    fn children(&self) -> &[Id] {
        &self.args
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.args
    }
}

impl fmt::Display for ENode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Leaf(n) => write!(f, "leaf{n}"),
            Kind::Full { bits, ty } => {
                write!(f, "full({:?}):{}", f64::from_bits(*bits), ty.tensor_type())
            }
            Kind::Iota { axis, ty } => write!(f, "iota({axis}):{}", ty.tensor_type()),
            Kind::Broadcast(d) => write!(f, "broadcast{}", Shape(d.clone())),
            Kind::Reshape(d) => write!(f, "reshape{}", Shape(d.clone())),
            Kind::Transpose(p) => write!(f, "transpose{p:?}"),
            Kind::Slice { axis, start, end } => write!(f, "slice({axis},{start},{end})"),
            Kind::Concat(axis) => write!(f, "concat({axis})"),
            Kind::Reduce(op, axes) => write!(f, "reduce_{op:?}{axes:?}"),
            Kind::MatMul { ta, tb } => write!(f, "matmul({ta},{tb})"),
            Kind::MatMulAcc { ta, tb } => write!(f, "matmul_acc({ta},{tb})"),
            Kind::Attention {
                causal,
                scale_bits,
                layout,
            } => write!(
                f,
                "attention({causal},{:?},{})",
                f64::from_bits(*scale_bits),
                layout.name()
            ),
            Kind::AttentionGrad {
                causal,
                scale_bits,
                layout,
            } => write!(
                f,
                "attention_grad({causal},{:?},{})",
                f64::from_bits(*scale_bits),
                layout.name()
            ),
            Kind::Output { index, ty } => write!(f, "result({index}):{}", ty.tensor_type()),
            Kind::ScatterAdd(rows, dtype) => write!(f, "scatter_add({rows},{dtype})"),
            Kind::Convert(d) => write!(f, "convert({d})"),
            Kind::Dropout { p_bits, salt } => {
                write!(f, "dropout({:?},{salt})", f64::from_bits(*p_bits))
            }
            other => {
                let tys: [&TensorType; 0] = [];
                match other.to_op(&tys) {
                    Some((op, _)) => f.write_str(op.name()),
                    None => write!(f, "{other:?}"),
                }
            }
        }
    }
}
