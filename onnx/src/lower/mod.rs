//! Tracing an ONNX graph onto Ingot's primitives: one function per op type, each writing the
//! same math PyTorch and onnxruntime compute with the builder's ops (`compiler/src/trace`).
//! Values are either graph nodes or host constants ([`crate::value::Const`]); an op whose
//! operands are all constants is evaluated on the host (shape arithmetic is folded this way),
//! and a constant a graph op reads is materialized: as `full` when every element is one value,
//! `iota` when it counts `0..n`, else as a resident state leaf holding its elements (returned
//! with the weights).

use crate::attrs::Attrs;
use crate::proto::NodeProto;
use crate::read::{dtype_of, tensor, DataDir};
use crate::value::{broadcast_dims, zip, Const, Data};
use indexmap::IndexMap;
use ingot_compiler::ir::{
    BinaryOp, CmpOp, Conv2d, DType, Graph, Init, Mode, NodeId, Pool2d, ReduceOp, Shape, TensorType,
    UnaryOp,
};
use ingot_compiler::trace::nn;
use std::collections::HashMap;

mod attention;
mod dims;
mod elementwise;
mod fold;
mod image;
mod layout;
mod linalg;
mod norm;
mod pad;

pub use dims::reshape_dims;
use dims::{expand_dims, norm_axes, norm_axis, split_sizes, squeeze_dims, transpose_perm};

/// A value while importing: a node of the graph, or a constant known on the host.
#[derive(Clone, Debug)]
pub enum Val {
    Node(NodeId),
    Const(Const),
}

/// The most elements a constant computed while importing may have (a `ConstantOfShape`, a
/// `Range`, a folded `Expand`): shapes and masks are far smaller, and a file cannot make the
/// importer allocate without bound.
pub const MAX_FOLDED: usize = 1 << 24;

/// A failure inside one node (the caller adds the node's op type and name).
pub type R<T> = std::result::Result<T, String>;

fn ir<T>(r: ingot_compiler::Result<T>) -> R<T> {
    r.map_err(|e| e.to_string())
}

/// A 2-d window's kernel, strides, symmetric padding and dilations.
type Window = ([usize; 2], [usize; 2], [usize; 2], [usize; 2]);

/// The tracer's state: the graph being built and every ONNX name's value so far.
pub struct Lower<'a> {
    pub g: &'a mut Graph,
    pub float: DType,
    pub dir: DataDir,
    pub env: HashMap<String, Val>,
    /// Constants materialized as state leaves: their name, type and little-endian bytes.
    pub constants: IndexMap<String, (TensorType, Vec<u8>)>,
    /// Every name some node reads or the graph outputs (an output no one reads, such as a
    /// Dropout's mask, is not computed).
    pub used: std::collections::HashSet<String>,
    /// `RandomUniformLike` outputs: the node's name (the draw's salt), `low` and `high`. Only
    /// a comparison with a constant reads one ([`crate::attrs`] checks), which becomes a
    /// Bernoulli draw of Ingot's seeded dropout mask.
    pub uniforms: HashMap<String, (String, f64, f64)>,
    /// The parts of each `SplitToSequence` output, by its name (read by `SequenceAt` only).
    pub sequences: HashMap<String, Vec<Val>>,
    /// Bernoulli masks (comparisons of a uniform draw), by ONNX name: the probability of true.
    pub bernoulli: HashMap<String, f64>,
    /// Embedding tables' padding rows, by initializer name: a `Gather` of such a table passes
    /// no gradient back to the rows it reads at that index (PyTorch's `padding_idx`).
    pub padding: &'a HashMap<String, i64>,
}

impl Lower<'_> {
    pub fn dims(&self, v: &Val) -> Vec<usize> {
        match v {
            Val::Node(id) => self.g.ty(*id).shape.dims().to_vec(),
            Val::Const(c) => c.dims.clone(),
        }
    }

    pub fn dtype(&self, v: &Val) -> DType {
        match v {
            Val::Node(id) => self.g.ty(*id).dtype,
            Val::Const(c) => c.dtype,
        }
    }

    /// The value `v` as a graph node; `hint` names a materialized constant's state leaf.
    pub fn node(&mut self, v: &Val, hint: &str) -> R<NodeId> {
        match v {
            Val::Node(id) => Ok(*id),
            Val::Const(c) => self.materialize(c, hint),
        }
    }

    fn materialize(&mut self, c: &Const, hint: &str) -> R<NodeId> {
        if c.numel() == 0 {
            return Err(format!(
                "constant {hint:?} has no elements (shape {:?})",
                c.dims
            ));
        }
        if let Some(v) = c.uniform() {
            return ir(self.g.full(v, Shape::new(&c.dims), c.dtype));
        }
        let counts =
            matches!(&c.data, Data::I(v) if v.iter().enumerate().all(|(i, &x)| x == i as i64));
        if c.dims.len() == 1 && counts && c.dtype != DType::Bool {
            return ir(self.g.iota(Shape::new(&c.dims), 0, c.dtype));
        }
        if let Some(small) = c.repeated() {
            let x = self.materialize(&small, hint)?;
            return ir(self.g.broadcast_to(x, Shape::new(&c.dims)));
        }
        if let Some((k, low, high)) = c.triangle() {
            // `select(j − i <= k, low, high)` from two iotas shaped as the constant: a mask
            // is computed, not stored. On the diagonal (`k = 0`) the iotas are compared
            // directly (`j > i`), the causal mask attention recognition fuses.
            let r = c.dims.len();
            let shape = Shape::new(&c.dims);
            let i = ir(self.g.iota(shape.clone(), r - 2, DType::I64))?;
            let j = ir(self.g.iota(shape, r - 1, DType::I64))?;
            let (lhs, rhs) = if k == 0 {
                (j, i)
            } else {
                let d = ir(self.g.sub(j, i))?;
                let kk = ir(self.g.full(k as f64, Shape::scalar(), DType::I64))?;
                (d, kk)
            };
            let above = ir(self.g.compare(CmpOp::Gt, lhs, rhs))?;
            if c.dtype == DType::Bool {
                return if low == 0.0 {
                    Ok(above)
                } else {
                    ir(self.g.compare(CmpOp::Le, lhs, rhs))
                };
            }
            let a = ir(self.g.full(high, Shape::scalar(), c.dtype))?;
            let b = ir(self.g.full(low, Shape::scalar(), c.dtype))?;
            return ir(self.g.select(above, a, b));
        }
        let name = hint.to_string();
        if let Some(id) = self.g.leaf(&name) {
            return Ok(id);
        }
        let ty = TensorType::new(Shape::new(&c.dims), c.dtype);
        self.constants
            .insert(name.clone(), (ty.clone(), c.to_le_bytes(c.dtype)));
        ir(self.g.state(&name, ty.shape, c.dtype, Init::Zeros))
    }

    /// Input `i` of `n`, or `None` when it is absent (past the end, or named "").
    pub fn opt(&self, n: &NodeProto, i: usize) -> R<Option<Val>> {
        match n.input.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(name) => self
                .env
                .get(name)
                .cloned()
                .map(Some)
                .ok_or_else(|| {
                    if self.sequences.contains_key(name) {
                        format!("input {name:?} is a sequence (SplitToSequence's output), which Ingot reads only through SequenceAt")
                    } else {
                        format!("input {name:?} has no value (dangling name)")
                    }
                }),
        }
    }

    pub fn arg(&self, n: &NodeProto, i: usize) -> R<Val> {
        self.opt(n, i)?
            .ok_or_else(|| format!("needs input {i}, which is missing"))
    }

    /// Input `i` as a host constant (a shape, axes, an exponent): anything computed from
    /// parameters or the batch is refused, naming the input.
    pub fn konst(&self, n: &NodeProto, i: usize) -> R<Option<Const>> {
        match self.opt(n, i)? {
            None => Ok(None),
            Some(Val::Const(c)) => Ok(Some(c)),
            Some(Val::Node(_)) => Err(format!(
                "input {i} ({:?}) must be a constant known at import time (Ingot plans static shapes), but it is computed from the model's inputs or parameters",
                n.input[i]
            )),
        }
    }

    fn konst_i64s(&self, n: &NodeProto, i: usize) -> R<Option<Vec<i64>>> {
        match self.konst(n, i)? {
            None => Ok(None),
            Some(c) => c
                .to_i64s()
                .map(Some)
                .ok_or_else(|| format!("input {i} must hold integers")),
        }
    }

    /// Two values as nodes of one dtype (a constant takes the other operand's dtype).
    fn pair(&mut self, n: &NodeProto, a: &Val, b: &Val) -> R<(NodeId, NodeId)> {
        let hint = |i: usize| n.input.get(i).cloned().unwrap_or_default();
        let (a, b) = match (a, b) {
            (Val::Const(c), Val::Node(y)) => {
                let dt = self.g.ty(*y).dtype;
                (self.materialize(&c.cast(dt), &hint(0))?, *y)
            }
            (Val::Node(x), Val::Const(c)) => {
                let dt = self.g.ty(*x).dtype;
                (*x, self.materialize(&c.cast(dt), &hint(1))?)
            }
            _ => (self.node(a, &hint(0))?, self.node(b, &hint(1))?),
        };
        let (ta, tb) = (self.g.ty(a).dtype, self.g.ty(b).dtype);
        if ta != tb {
            return Err(format!(
                "operands have different element types ({ta} and {tb})"
            ));
        }
        Ok((a, b))
    }

    fn scalar(&mut self, v: f64, like: NodeId) -> R<NodeId> {
        let dt = self.g.ty(like).dtype;
        ir(self.g.full(v, Shape::scalar(), dt))
    }

    /// Traces node `n` (named `name`) and returns its outputs' values in order.
    pub fn lower(&mut self, n: &NodeProto, name: &str) -> R<Vec<Val>> {
        let op = n.op_type();
        let at = Attrs(&n.attribute);
        // Shape and Size read only their input's static shape: always constants.
        if op == "Shape" || op == "Size" {
            return self.shape_or_size(n, &at);
        }
        // Every op whose operands are all constants is computed on the host when it can be.
        let all_const = !n.input.is_empty()
            && (0..n.input.len())
                .all(|i| matches!(self.opt(n, i), Ok(None) | Ok(Some(Val::Const(_)))));
        if all_const {
            if let Some(out) = self.fold(n, &at)? {
                return Ok(out);
            }
        }
        match op {
            "Constant" => Ok(vec![Val::Const(self.constant(&at)?)]),
            "Identity" => Ok(vec![self.arg(n, 0)?]),
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" => self.arithmetic(n, op),
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => self.comparison(n, op),
            "Not" | "And" | "Or" => self.logic(n, op),
            "Where" => self.select(n),
            "Neg" | "Exp" | "Log" | "Sqrt" | "Tanh" | "Reciprocal" => self.unary(n, op),
            "Relu" | "LeakyRelu" | "Abs" | "Sigmoid" | "Softplus" | "HardSigmoid" | "HardSwish"
            | "Gelu" | "Erf" | "IsNaN" => self.activation(n, &at, op),
            "RandomUniformLike" => self.random_uniform(n, &at, name),
            "Pow" => self.pow(n),
            "Clip" => self.clip(n),
            "Cast" | "CastLike" => self.cast(n, &at, op),
            "MatMul" => self.matmul(n),
            "Gemm" => self.gemm(n, &at),
            "Conv" => self.conv(n, &at),
            "ConvTranspose" => self.conv_transpose(n, &at),
            "Resize" => self.resize(n, &at),
            "BatchNormalization" => self.batch_norm(n, &at, name),
            "MaxPool" => self.max_pool(n, &at),
            "AveragePool" => self.avg_pool(n, &at),
            "GlobalAveragePool" | "GlobalMaxPool" => self.global_pool(n, op),
            "Softmax" | "LogSoftmax" => self.softmax(n, &at, op),
            "LayerNormalization" => self.layer_norm(n, &at),
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" => self.reduce(n, &at),
            "Range" | "ConstantOfShape" | "Floor" | "Ceil" => Err(format!(
                "{op} of a computed value: Ingot evaluates it only on constants (shapes and values known at import); on tensors it needs a primitive of its own"
            )),
            "Dropout" => self.dropout(n, name),
            "GatherElements" => Err(
                "GatherElements of a computed tensor needs a gather-elements primitive (Ingot folds it when data and indices are constants)".into(),
            ),
            "Mod" => Err(
                "Mod of a computed value: Ingot evaluates it only on constants (shape arithmetic)".into(),
            ),
            "Flatten" => self.flatten(n, &at),
            "Reshape" => self.reshape(n),
            "Squeeze" | "Unsqueeze" => self.squeeze(n, &at, op),
            "Transpose" => self.transpose(n, &at),
            "Expand" => self.expand(n),
            "Concat" if n.input.is_empty() => Err("joins no inputs".into()),
            "Concat" => self.concat(n, &at),
            "Split" => self.split(n, &at),
            "SplitToSequence" => self.split_to_sequence(n, &at),
            "SequenceAt" => self.sequence_at(n),
            "Slice" => self.slice(n),
            "Pad" => self.pad(n, &at),
            "Gather" => self.gather(n, &at),
            "Trilu" => self.trilu(n, &at),
            "Einsum" => self.einsum(n, &at),
            "Attention" => self.attention(n, &at),
            "GatherND" => Err(
                "GatherND of a computed tensor needs a gather primitive (Ingot folds it when data and indices are constants)".into(),
            ),
            _ => Err(format!(
                "{op} has no import (check_node should have refused it)"
            )),
        }
    }

    /// Shape (from `start` to `end`) and Size of the input's static shape, as constants.
    fn shape_or_size(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let op = n.op_type();
        let x = self.arg(n, 0)?;
        let d: Vec<i64> = self.dims(&x).iter().map(|&s| s as i64).collect();
        if op == "Size" {
            let count = d.iter().product::<i64>();
            return Ok(vec![Val::Const(Const::new(
                DType::I64,
                vec![],
                Data::I(vec![count]),
            ))]);
        }
        let r = d.len() as i64;
        let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let (s, e) = (clampi(at.int("start", 0)), clampi(at.int("end", r)));
        Ok(vec![Val::Const(Const::i64s(d[s..e.max(s)].to_vec()))])
    }
}

/// A node's one output.
fn one(v: NodeId) -> R<Vec<Val>> {
    Ok(vec![Val::Node(v)])
}
