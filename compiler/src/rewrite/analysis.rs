//! The e-class analysis: what every e-class knows about its value.
//!
//! - its [`TensorType`], computed with [`crate::ir::infer`] when the class is made and checked
//!   again on every merge: two classes of different types must never merge, so a merge that
//!   would is recorded as an error (it means a rule is wrong) and [`super::simplify`] fails;
//! - an optional known constant: a value that every element equals, as the runtime would store
//!   it (an f32 constant is an f64 that is exactly an f32, an integer constant an integer, a bool
//!   0 or 1), folded with the runtime's numeric semantics (runtime/src/cpu/exec.rs: f32 math in
//!   f32, wrapping integers, `as` conversions, NaN-ignoring float max and min);
//! - for the input graph's leaves, the leaf's number, so that two leaves never merge.

use super::lang::{ENode, Kind};
use crate::ir::scalar::exact_i64;
pub use crate::ir::scalar::{binary, canonical, compare, convert, numel, unary};
use crate::ir::{BinaryOp, DType, ReduceOp, Shape, TensorType};
use egg::{DidMerge, Id};
use smallvec::SmallVec;

/// The e-graph the rewriter works on.
pub type EGraph = egg::EGraph<ENode, Facts>;

/// At most this many error messages are kept (the first ones name the faulty rule).
const MAX_ERRORS: usize = 16;

/// The classes of an e-graph in id order, each with the bits of what it holds and of what its
/// e-nodes' operands hold (built and read in [`super::index`]).
#[derive(Debug, Default)]
pub struct ClassIndex {
    pub(super) classes: Vec<(Id, u64, u64)>,
    /// The e-graph's fingerprint (`index::fingerprint`) when the index was built: a searcher
    /// finding another (an index that missed a change) searches every class instead.
    pub(super) built_for: (usize, usize),
}

/// The analysis state: the leaves' types and the errors met so far.
#[derive(Debug, Default)]
pub struct Facts {
    /// The type of leaf number `n` (leaves counted in the input graph's order).
    pub leaf_types: Vec<TensorType>,
    /// Type conflicts and ill-typed nodes: each one is a rule bug.
    pub errors: Vec<String>,
    /// The classes each rule searches, built before each iteration's search.
    pub index: ClassIndex,
}

impl Facts {
    pub fn error(&mut self, message: String) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(message);
        }
    }
}

/// What an e-class knows about its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Data {
    pub ty: TensorType,
    /// Every element equals this value (see the module docs for its representation).
    pub constant: Option<f64>,
    /// The class holds the input graph's leaf number `n`.
    pub leaf: Option<u32>,
}

impl egg::Analysis<ENode> for Facts {
    type Data = Data;

    fn make(egraph: &mut EGraph, enode: &ENode, _id: Id) -> Data {
        let (ty, constant) = {
            let eg: &EGraph = egraph;
            let types: SmallVec<[&TensorType; 3]> =
                enode.args.iter().map(|&c| &eg[c].data.ty).collect();
            let consts: SmallVec<[Option<f64>; 3]> =
                enode.args.iter().map(|&c| eg[c].data.constant).collect();
            let ty = enode.kind.result_type(&types, &eg.analysis.leaf_types);
            let constant = ty
                .as_ref()
                .ok()
                .and_then(|t| fold(&enode.kind, t, &types, &consts));
            (ty, constant)
        };
        let ty = ty.unwrap_or_else(|e| {
            egraph
                .analysis
                .error(format!("the e-node {enode} is ill-typed: {e}"));
            TensorType::new(Shape::scalar(), DType::F32)
        });
        let leaf = match enode.kind {
            Kind::Leaf(n) => Some(n),
            _ => None,
        };
        Data { ty, constant, leaf }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        if a.ty != b.ty {
            self.error(format!(
                "the e-graph merged classes of different types {} and {}",
                a.ty, b.ty
            ));
        }
        let (mut changed_a, mut changed_b) = (false, false);
        match (a.constant, b.constant) {
            (None, Some(v)) => {
                a.constant = Some(v);
                changed_a = true;
            }
            (Some(_), None) => changed_b = true,
            // Equal up to rounding (a rule that reassociates constants); keep the first.
            (Some(x), Some(y)) if x.to_bits() != y.to_bits() => changed_b = true,
            _ => {}
        }
        match (a.leaf, b.leaf) {
            (None, Some(n)) => {
                a.leaf = Some(n);
                changed_a = true;
            }
            (Some(_), None) => changed_b = true,
            (Some(x), Some(y)) if x != y => {
                self.error(format!(
                    "the e-graph merged two leaves (numbers {x} and {y})"
                ));
                changed_b = true;
            }
            _ => {}
        }
        DidMerge(changed_a, changed_b)
    }
}

/// The constant value of `kind` applied to operands with these types and known constants.
fn fold(
    kind: &Kind,
    ty: &TensorType,
    types: &[&TensorType],
    consts: &[Option<f64>],
) -> Option<f64> {
    let c = |i: usize| consts.get(i).copied().flatten();
    let dtype = ty.dtype;
    match kind {
        Kind::Leaf(_)
        | Kind::Gather
        | Kind::ScatterAdd(..)
        | Kind::Attention { .. }
        | Kind::AttentionGrad { .. }
        | Kind::Output { .. }
        | Kind::AllReduce(_)
        | Kind::AllGather(_)
        | Kind::ReduceScatter(_)
        | Kind::MatMulAcc { .. }
        | Kind::Dropout { .. } => None,
        // A window op of a constant is not constant (padding reads zeros).
        Kind::Window(_) => None,
        Kind::Full { bits, .. } => canonical(f64::from_bits(*bits), dtype),
        Kind::Iota { axis, .. } => match ty.shape.dims().get(*axis) {
            Some(1) => canonical(0.0, dtype),
            _ => None,
        },
        Kind::Unary(u) => unary(*u, c(0)?, dtype),
        Kind::Binary(b) => binary(*b, c(0)?, c(1)?, dtype),
        Kind::Compare(op) => Some(compare(*op, c(0)?, c(1)?)),
        Kind::Select => match c(0) {
            Some(cond) => c(if cond != 0.0 { 1 } else { 2 }),
            None => match (c(1), c(2)) {
                (Some(x), Some(y)) if x.to_bits() == y.to_bits() => Some(x),
                _ => None,
            },
        },
        Kind::Broadcast(_)
        | Kind::Reshape(_)
        | Kind::Transpose(_)
        | Kind::Slice { .. }
        | Kind::StopGradient => c(0),
        Kind::Concat(_) => {
            let first = c(0)?;
            (0..consts.len())
                .all(|i| c(i).map(f64::to_bits) == Some(first.to_bits()))
                .then_some(first)
        }
        Kind::Reduce(op, axes) => {
            let v = c(0)?;
            let dims = types.first()?.shape.dims();
            let count = axes
                .iter()
                .try_fold(1usize, |acc, &a| acc.checked_mul(*dims.get(a)?))?;
            match op {
                ReduceOp::Sum => sum_of(v, count, dtype),
                // The max of copies of `v` is `v`, NaN included (NaN propagates through max).
                ReduceOp::Max => Some(v),
            }
        }
        Kind::MatMul { ta, .. } => {
            let (a, b) = (c(0)?, c(1)?);
            let dims = types.first()?.shape.dims();
            let r = dims.len();
            if r < 2 {
                return None;
            }
            let k = if *ta { dims[r - 2] } else { dims[r - 1] };
            if k == 0 {
                return canonical(0.0, dtype);
            }
            // bf16: the kernel sums f32 products and rounds once; not folded.
            if dtype == DType::BF16 {
                return None;
            }
            let p = binary(BinaryOp::Mul, a, b, dtype)?;
            canonical(p * k as f64, dtype)
        }
        Kind::Convert(to) => convert(c(0)?, types.first()?.dtype, *to),
    }
}

/// The sum of `count` copies of `v` (up to rounding for floats; wrapping for integers).
fn sum_of(v: f64, count: usize, dtype: DType) -> Option<f64> {
    if count == 0 {
        return canonical(0.0, dtype);
    }
    match dtype {
        // `+ 0.0`: the kernel's sum starts from +0, so a sum of -0s is +0.
        DType::F32 | DType::F64 => canonical(v * count as f64 + 0.0, dtype),
        DType::I32 => Some(((v as i128).wrapping_mul(count as i128) as i32) as f64),
        DType::I64 => exact_i64((v as i128).wrapping_mul(count as i128) as i64),
        // The kernel accumulates in f32 and rounds once at the end; not folded.
        DType::Bool | DType::BF16 => None,
    }
}
