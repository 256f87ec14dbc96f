//! The fused-kernel description itself: a domain, its inputs and how they are read, a body of
//! instructions and the values written out. What the instructions mean, and the rules a kernel
//! must keep, are in the docs of [`crate::fused`]; [`FusedKernel::check`] holds a kernel to them.

use crate::dtype::DType;
use crate::ops::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
use serde::{Deserialize, Serialize};

/// One fused kernel launch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FusedKernel {
    /// The iteration space, row-major.
    pub domain: Vec<usize>,
    /// Sorted, distinct axes of `domain` that [`Inst::Reduce`] folds; empty for an elementwise
    /// kernel.
    pub reduce_axes: Vec<usize>,
    pub inputs: Vec<Input>,
    pub body: Vec<Inst>,
    pub outputs: Vec<Output>,
}

impl FusedKernel {
    /// How many reductions the body holds: an executor evaluates the body once per reduction
    /// level, so a kernel's work and bookkeeping grow with this times the body's length.
    pub fn reductions(&self) -> usize {
        self.body
            .iter()
            .filter(|i| matches!(i, Inst::Reduce { .. }))
            .count()
    }
}

/// A buffer the kernel reads, and how domain indices map into it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Input {
    pub dtype: DType,
    /// Elements in the buffer; every access must fall inside it.
    pub len: usize,
    pub access: Access,
}

/// An affine map from domain indices to a buffer's element index.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Access {
    pub offset: usize,
    /// One per domain axis.
    pub strides: Vec<usize>,
}

impl Access {
    /// The identity map of a contiguous buffer shaped like `dims`.
    pub fn contiguous(dims: &[usize]) -> Access {
        let mut strides = vec![0; dims.len()];
        let mut s = 1;
        for d in (0..dims.len()).rev() {
            strides[d] = s;
            s *= dims[d];
        }
        Access { offset: 0, strides }
    }
}

/// One instruction. Operands are indices of earlier instructions in the body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Inst {
    Load {
        input: usize,
    },
    Const {
        #[serde(with = "any_f64")]
        value: f64,
        dtype: DType,
    },
    /// The domain index along `axis`, as `dtype`.
    Index {
        axis: usize,
        dtype: DType,
    },
    Unary {
        op: UnaryOp,
        x: usize,
    },
    Binary {
        op: BinaryOp,
        a: usize,
        b: usize,
    },
    /// Gives bool.
    Compare {
        op: CmpOp,
        a: usize,
        b: usize,
    },
    /// `a` where `cond` is true, else `b`.
    Select {
        cond: usize,
        a: usize,
        b: usize,
    },
    Convert {
        x: usize,
        to: DType,
    },
    /// Folds `x` over the reduce axes.
    Reduce {
        op: ReduceOp,
        x: usize,
    },
}

impl Inst {
    /// `op(a, b)` of instructions `a` and `b`: a body written by hand reads as its formula.
    pub fn binary(op: BinaryOp, a: usize, b: usize) -> Inst {
        Inst::Binary { op, a, b }
    }

    /// `op(x)` of instruction `x`.
    pub fn unary(op: UnaryOp, x: usize) -> Inst {
        Inst::Unary { op, x }
    }
}

/// A buffer the kernel writes: one instruction's values, contiguous, row-major.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Output {
    pub value: usize,
}

/// Serde for an f64 that may be infinite or NaN: JSON has no such numbers (serde_json writes
/// them as `null`, which reads back as an error), so they are written as the strings `"inf"`,
/// `"-inf"` and `"nan"`; finite values stay numbers, so the text of every finite constant is
/// unchanged.
mod any_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_finite() {
            s.serialize_f64(*x)
        } else if x.is_nan() {
            s.serialize_str("nan")
        } else if *x > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Number(x) => Ok(x),
            Repr::Text(t) => match t.as_str() {
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                "nan" => Ok(f64::NAN),
                _ => Err(serde::de::Error::custom(format!(
                    "a constant is a number, \"inf\", \"-inf\" or \"nan\", not {t:?}"
                ))),
            },
        }
    }
}
