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
    /// Bernoulli masks (comparisons of a uniform draw), by ONNX name: the probability of true.
    pub bernoulli: HashMap<String, f64>,
}

fn norm_axis(axis: i64, rank: usize) -> R<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a as usize >= rank.max(1) && !(rank == 0 && a == 0) {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(a as usize)
}

fn norm_axes(axes: &[i64], rank: usize) -> R<Vec<usize>> {
    let mut out: Vec<usize> = axes.iter().map(|&a| norm_axis(a, rank)).collect::<R<_>>()?;
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("axes {axes:?} repeat an axis"));
    }
    Ok(out)
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
                .ok_or_else(|| format!("input {name:?} has no value (dangling name)")),
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
            return Ok(vec![Val::Const(Const::i64s(d[s..e.max(s)].to_vec()))]);
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
        let one = |v: NodeId| Ok(vec![Val::Node(v)]);
        match op {
            "Constant" => Ok(vec![Val::Const(self.constant(&at)?)]),
            "Identity" => Ok(vec![self.arg(n, 0)?]),
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" => {
                let bop = match op {
                    "Add" => BinaryOp::Add,
                    "Sub" => BinaryOp::Sub,
                    "Mul" => BinaryOp::Mul,
                    "Div" => BinaryOp::Div,
                    "Max" => BinaryOp::Max,
                    _ => BinaryOp::Min,
                };
                let mut acc = self.arg(n, 0)?;
                for i in 1..n.input.len() {
                    let b = self.arg(n, i)?;
                    let (x, y) = self.pair(n, &acc, &b)?;
                    acc = Val::Node(ir(self.g.binary(bop, x, y))?);
                }
                Ok(vec![acc])
            }
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
                let c = match op {
                    "Equal" => CmpOp::Eq,
                    "Less" => CmpOp::Lt,
                    "Greater" => CmpOp::Gt,
                    "LessOrEqual" => CmpOp::Le,
                    _ => CmpOp::Ge,
                };
                if let Some(v) = self.bernoulli_draw(n, c)? {
                    return one(v);
                }
                let (a, b) = (self.arg(n, 0)?, self.arg(n, 1)?);
                let (x, y) = self.pair(n, &a, &b)?;
                one(ir(self.g.compare(c, x, y))?)
            }
            "Not" | "And" | "Or" => {
                let x = self.arg(n, 0)?;
                let x = self.node(&x, &n.input[0])?;
                let t = ir(self.g.full(1.0, Shape::scalar(), DType::Bool))?;
                let f = ir(self.g.full(0.0, Shape::scalar(), DType::Bool))?;
                match op {
                    "Not" => one(ir(self.g.select(x, f, t))?),
                    _ => {
                        let y = self.arg(n, 1)?;
                        let y = self.node(&y, &n.input[1])?;
                        if op == "And" {
                            one(ir(self.g.select(x, y, f))?)
                        } else {
                            one(ir(self.g.select(x, t, y))?)
                        }
                    }
                }
            }
            "Where" => {
                let c = self.arg(n, 0)?;
                let c = self.node(&c, &n.input[0])?;
                let (a, b) = (self.arg(n, 1)?, self.arg(n, 2)?);
                let (x, y) = self.pair(n, &a, &b)?;
                one(ir(self.g.select(c, x, y))?)
            }
            "Neg" | "Exp" | "Log" | "Sqrt" | "Tanh" | "Reciprocal" => {
                let u = match op {
                    "Neg" => UnaryOp::Neg,
                    "Exp" => UnaryOp::Exp,
                    "Log" => UnaryOp::Log,
                    "Sqrt" => UnaryOp::Sqrt,
                    "Tanh" => UnaryOp::Tanh,
                    _ => UnaryOp::Recip,
                };
                let x = self.float_in(n, 0)?;
                one(ir(self.g.unary(u, x))?)
            }
            "Relu" => {
                let x = self.float_in(n, 0)?;
                one(ir(nn::relu(self.g, x))?)
            }
            "LeakyRelu" => {
                let x = self.float_in(n, 0)?;
                let alpha = at.float("alpha", 0.01);
                let zero = self.scalar(0.0, x)?;
                let neg = ir(self.g.compare(CmpOp::Lt, x, zero))?;
                let ax = ir(self.g.mul_scalar(x, alpha))?;
                one(ir(self.g.select(neg, ax, x))?)
            }
            "Abs" => {
                let x = self.float_in(n, 0)?;
                one(self.abs(x)?)
            }
            "Sigmoid" => {
                let x = self.float_in(n, 0)?;
                one(self.sigmoid(x)?)
            }
            "Softplus" => {
                // max(x, 0) + log(1 + exp(−|x|)): finite everywhere, gradients included.
                let x = self.float_in(n, 0)?;
                let a = self.abs(x)?;
                let na = ir(self.g.neg(a))?;
                let e = ir(self.g.exp(na))?;
                let e1 = ir(self.g.add_scalar(e, 1.0))?;
                let l = ir(self.g.log(e1))?;
                let zero = self.scalar(0.0, x)?;
                let m = ir(self.g.maximum(x, zero))?;
                one(ir(self.g.add(m, l))?)
            }
            "HardSigmoid" | "HardSwish" => {
                let x = self.float_in(n, 0)?;
                let (alpha, beta) = if op == "HardSwish" {
                    (1.0 / 6.0, 0.5)
                } else {
                    (at.float("alpha", 0.2), at.float("beta", 0.5))
                };
                let ax = ir(self.g.mul_scalar(x, alpha))?;
                let y = ir(self.g.add_scalar(ax, beta))?;
                let one_ = self.scalar(1.0, x)?;
                let zero = self.scalar(0.0, x)?;
                let y = ir(self.g.minimum(y, one_))?;
                let y = ir(self.g.maximum(y, zero))?;
                if op == "HardSwish" {
                    one(ir(self.g.mul(x, y))?)
                } else {
                    one(y)
                }
            }
            "Gelu" if at.string("approximate", "none") == "tanh" => {
                let x = self.float_in(n, 0)?;
                one(ir(nn::gelu_tanh(self.g, x))?)
            }
            "Gelu" => {
                // Exact GELU, `x·½·(1 + erf(x/√2))` (PyTorch's default `F.gelu`).
                let x = self.float_in(n, 0)?;
                let s = ir(self.g.mul_scalar(x, std::f64::consts::FRAC_1_SQRT_2))?;
                let e = ir(self.g.unary(UnaryOp::Erf, s))?;
                let e1 = ir(self.g.add_scalar(e, 1.0))?;
                let h = ir(self.g.mul_scalar(x, 0.5))?;
                one(ir(self.g.mul(h, e1))?)
            }
            "Erf" => {
                let x = self.float_in(n, 0)?;
                one(ir(self.g.unary(UnaryOp::Erf, x))?)
            }
            "IsNaN" => {
                // NaN is the one value unequal to itself.
                let x = self.float_in(n, 0)?;
                one(ir(self.g.compare(CmpOp::Ne, x, x))?)
            }
            "RandomUniformLike" => self.random_uniform(n, &at, name),
            "Pow" => self.pow(n),
            "Clip" => {
                let x = self.float_in(n, 0)?;
                let mut y = x;
                if let Some(lo) = self.konst(n, 1)? {
                    let lo = lo.scalar().ok_or("min must be a scalar")?;
                    let k = self.scalar(lo, x)?;
                    y = ir(self.g.maximum(y, k))?;
                }
                if let Some(hi) = self.konst(n, 2)? {
                    let hi = hi.scalar().ok_or("max must be a scalar")?;
                    let k = self.scalar(hi, x)?;
                    y = ir(self.g.minimum(y, k))?;
                }
                one(y)
            }
            "Cast" | "CastLike" => {
                let to = if op == "Cast" {
                    dtype_of(at.int("to", 0) as i32, self.float)?
                } else {
                    let like = self.arg(n, 1)?;
                    self.dtype(&like)
                };
                // A Bernoulli(q) mask cast to a float is, in evaluation mode, its expectation
                // q: `mask / q` (stochastic depth, `bernoulli_` then `div_`) is then 1, the
                // identity PyTorch's evaluation mode computes.
                if let Some(&q) = self.bernoulli.get(&n.input[0]) {
                    if self.g.mode() == Mode::Eval && to.is_float() {
                        let x = self.arg(n, 0)?;
                        let d = self.dims(&x);
                        return one(ir(self.g.full(q, Shape::new(&d), to))?);
                    }
                }
                let x = self.arg(n, 0)?;
                let x = self.node(&x, &n.input[0])?;
                one(ir(self.g.convert(x, to))?)
            }
            "MatMul" => self.matmul(n),
            "Gemm" => self.gemm(n, &at),
            "Conv" => self.conv(n, &at),
            "ConvTranspose" => self.conv_transpose(n, &at),
            "Resize" => self.resize(n, &at),
            "BatchNormalization" => self.batch_norm(n, &at, name),
            "MaxPool" => self.max_pool(n, &at),
            "AveragePool" => self.avg_pool(n, &at),
            "GlobalAveragePool" | "GlobalMaxPool" => {
                let x = self.float_in(n, 0)?;
                let r = self.g.ty(x).shape.rank();
                if r < 3 {
                    return Err(format!("needs an input [N, C, ...], got {}", self.g.ty(x)));
                }
                let axes: Vec<usize> = (2..r).collect();
                if op == "GlobalAveragePool" {
                    one(ir(self.g.mean(x, &axes))?)
                } else {
                    one(ir(self.g.max(x, &axes))?)
                }
            }
            "Softmax" | "LogSoftmax" => {
                let x = self.float_in(n, 0)?;
                let r = self.g.ty(x).shape.rank();
                let axis = norm_axis(at.int("axis", -1), r)?;
                let y = self.along_last(x, axis, |g, x| {
                    if op == "Softmax" {
                        nn::softmax(g, x)
                    } else {
                        nn::log_softmax(g, x)
                    }
                })?;
                one(y)
            }
            "LayerNormalization" => self.layer_norm(n, &at),
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" => self.reduce(n, &at),
            "Range" | "ConstantOfShape" | "Floor" | "Ceil" => Err(format!(
                "{op} of a computed value: Ingot evaluates it only on constants (shapes and values known at import); on tensors it needs a primitive of its own"
            )),
            "Dropout" => {
                let x = self.float_in(n, 0)?;
                let p = match self.konst(n, 1)? {
                    Some(c) => c.scalar().ok_or("ratio must be a scalar")?,
                    None => 0.5,
                };
                let train = match self.konst(n, 2)? {
                    Some(c) => c.scalar().ok_or("training_mode must be a scalar")? != 0.0,
                    None => false,
                };
                let mask_used = n.output.get(1).is_some_and(|m| self.used.contains(m));
                if !train || self.g.mode() == Mode::Eval {
                    if mask_used {
                        let d = self.g.ty(x).shape.clone();
                        let t = ir(self.g.full(1.0, d, DType::Bool))?;
                        return Ok(vec![Val::Node(x), Val::Node(t)]);
                    }
                    return one(x);
                }
                let y = ir(nn::dropout(self.g, name, x, p))?;
                if !mask_used {
                    return one(y);
                }
                // The mask is the same draw (seed, the node's salt, each element's index) of
                // a tensor of ones: kept where it is not zero.
                let ones = ir(self.g.full_like(1.0, x))?;
                let kept = ir(nn::dropout(self.g, name, ones, p))?;
                let zero = self.scalar(0.0, x)?;
                let mask = ir(self.g.compare(CmpOp::Ne, kept, zero))?;
                Ok(vec![Val::Node(y), Val::Node(mask)])
            }
            "GatherElements" => Err(
                "GatherElements of a computed tensor needs a gather-elements primitive (Ingot folds it when data and indices are constants)".into(),
            ),
            "Mod" => Err(
                "Mod of a computed value: Ingot evaluates it only on constants (shape arithmetic)".into(),
            ),
            "Flatten" => {
                let x = self.arg(n, 0)?;
                let d = self.dims(&x);
                let axis = at.int("axis", 1);
                let axis = if axis < 0 {
                    axis + d.len() as i64
                } else {
                    axis
                };
                if axis < 0 || axis as usize > d.len() {
                    return Err(format!(
                        "axis {} is out of range for rank {}",
                        at.int("axis", 1),
                        d.len()
                    ));
                }
                let a = axis as usize;
                let shape = [d[..a].iter().product::<usize>(), d[a..].iter().product()];
                self.reshape_val(n, x, &shape)
            }
            "Reshape" => {
                let x = self.arg(n, 0)?;
                let spec = self.konst_i64s(n, 1)?.ok_or("needs a shape")?;
                let shape = reshape_dims(&self.dims(&x), &spec)?;
                self.reshape_val(n, x, &shape)
            }
            "Squeeze" | "Unsqueeze" => {
                let x = self.arg(n, 0)?;
                let axes = match self.konst_i64s(n, 1)? {
                    Some(a) => Some(a),
                    None => at.ints("axes"),
                };
                let shape = squeeze_dims(op, &self.dims(&x), axes.as_deref())?;
                self.reshape_val(n, x, &shape)
            }
            "Transpose" => {
                let x = self.arg(n, 0)?;
                let r = self.dims(&x).len();
                let perm = transpose_perm(at.ints("perm"), r)?;
                let x = self.node(&x, &n.input[0])?;
                one(ir(self.g.transpose(x, &perm))?)
            }
            "Expand" => {
                let x = self.arg(n, 0)?;
                let shape = self.konst_i64s(n, 1)?.ok_or("needs a shape")?;
                let target = expand_dims(&self.dims(&x), &shape)?;
                let x = self.node(&x, &n.input[0])?;
                let rank = target.len();
                let x = self.lift(x, rank)?;
                one(ir(self.g.broadcast_to(x, Shape::new(&target)))?)
            }
            "Concat" if n.input.is_empty() => Err("joins no inputs".into()),
            "Concat" => {
                let parts: Vec<Val> = (0..n.input.len())
                    .map(|i| self.arg(n, i))
                    .collect::<R<_>>()?;
                let r = self.dims(&parts[0]).len();
                let axis = norm_axis(at.int("axis", 0), r)?;
                let mut ids = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    // An empty constant part (a shape sliced to nothing) adds nothing.
                    if matches!(p, Val::Const(c) if c.dims.get(axis) == Some(&0)) {
                        continue;
                    }
                    ids.push(self.node(p, &n.input[i])?);
                }
                one(ir(self.g.concat(&ids, axis))?)
            }
            "Split" => {
                let x = self.arg(n, 0)?;
                let d = self.dims(&x);
                let axis = norm_axis(at.int("axis", 0), d.len())?;
                let sizes = split_sizes(self.konst_i64s(n, 1)?, &at, n.output.len(), d[axis])?;
                let x = self.node(&x, &n.input[0])?;
                let mut out = Vec::new();
                let mut start = 0;
                for s in sizes {
                    out.push(Val::Node(ir(self.g.slice(x, axis, start, start + s))?));
                    start += s;
                }
                Ok(out)
            }
            "Slice" => {
                let x = self.arg(n, 0)?;
                let d = self.dims(&x);
                let picks = slice_picks(self, n, &d)?;
                if let Some((axis, _)) = picks.iter().find(|(_, p)| p.is_empty()) {
                    return Err(format!(
                        "slices axis {axis} (size {}) of a computed tensor to nothing: Ingot's tensors cannot be zero-sized",
                        d[*axis]
                    ));
                }
                let mut x = self.node(&x, &n.input[0])?;
                for (axis, p) in picks {
                    let (s, e) = (p[0], p[p.len() - 1] + 1);
                    if p.len() > 1 && p.windows(2).any(|w| w[1] != w[0] + 1) {
                        return Err(format!(
                            "a step other than 1 on axis {axis} of a computed tensor needs a strided slice primitive"
                        ));
                    }
                    x = ir(self.g.slice(x, axis, s, e))?;
                }
                one(x)
            }
            "Gather" => self.gather(n, &at),
            "Trilu" => {
                let x = self.arg(n, 0)?;
                let x = self.node(&x, &n.input[0])?;
                let k = self.trilu_k(n)?;
                let d = self.g.ty(x).shape.dims().to_vec();
                if d.len() < 2 {
                    return Err(format!("needs at least two axes, got {:?}", d));
                }
                let rc = [d[d.len() - 2], d[d.len() - 1]];
                let i = ir(self.g.iota(rc, 0, DType::I64))?;
                let j = ir(self.g.iota(rc, 1, DType::I64))?;
                let diff = ir(self.g.sub(j, i))?;
                let kk = ir(self.g.full(k as f64, Shape::scalar(), DType::I64))?;
                let c = if at.int("upper", 1) != 0 {
                    CmpOp::Ge
                } else {
                    CmpOp::Le
                };
                let keep = ir(self.g.compare(c, diff, kk))?;
                let zero = self.scalar(0.0, x)?;
                one(ir(self.g.select(keep, x, zero))?)
            }
            "Einsum" => self.einsum(n, &at),
            _ => Err(format!(
                "{op} has no import (check_node should have refused it)"
            )),
        }
    }

    /// `RandomUniformLike`: recorded, not computed. Its only readers are comparisons with a
    /// constant ([`Self::bernoulli_draw`]); the value returned here stands for the draw's
    /// shape and is never read.
    fn random_uniform(&mut self, n: &NodeProto, at: &Attrs, name: &str) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let d = self.dims(&x);
        let (low, high) = (at.float("low", 0.0), at.float("high", 1.0));
        if high <= low {
            return Err(format!("high {high} is not above low {low}"));
        }
        let dt = if at.has("dtype") {
            dtype_of(at.int("dtype", 1) as i32, self.float)?
        } else {
            self.dtype(&x)
        };
        if !dt.is_float() {
            return Err(format!("dtype {dt} is not a float"));
        }
        let out = n.output.first().ok_or("has no output")?;
        self.uniforms
            .insert(out.clone(), (name.to_string(), low, high));
        Ok(vec![Val::Node(ir(self.g.full(
            (low + high) / 2.0,
            Shape::new(&d),
            dt,
        ))?)])
    }

    /// A comparison of a `RandomUniformLike` draw `u` with a constant scalar `q` (PyTorch's
    /// `bernoulli_(p)`: `u < p`): a Bernoulli mask, true with the probability the comparison
    /// has, drawn as Ingot's seeded dropout mask of a tensor of ones (salted by the uniform's
    /// node, so every step draws anew and the backward pass sees the same draw). In
    /// evaluation mode the mask is all true (and cast to a float, its expectation: see
    /// `Cast`). `None` when neither operand is a uniform draw.
    fn bernoulli_draw(&mut self, n: &NodeProto, c: CmpOp) -> R<Option<NodeId>> {
        let side = (0..2).find(|&i| {
            n.input
                .get(i)
                .is_some_and(|s| self.uniforms.contains_key(s))
        });
        let Some(side) = side else {
            return Ok(None);
        };
        let (salt, low, high) = self.uniforms[&n.input[side]].clone();
        let q = self
            .konst(n, 1 - side)
            .map_err(|_| "compares a random draw with a computed value: Ingot imports a comparison of RandomUniformLike with a constant (a Bernoulli draw) only".to_string())?
            .and_then(|k| k.scalar())
            .ok_or("compares a random draw with something other than one constant")?;
        // The comparison as `u OP q` (swapped when the draw is on the right).
        let c = if side == 0 {
            c
        } else {
            match c {
                CmpOp::Lt => CmpOp::Gt,
                CmpOp::Gt => CmpOp::Lt,
                CmpOp::Le => CmpOp::Ge,
                CmpOp::Ge => CmpOp::Le,
                other => other,
            }
        };
        let below = ((q - low) / (high - low)).clamp(0.0, 1.0);
        let keep = match c {
            CmpOp::Lt | CmpOp::Le => below,
            CmpOp::Gt | CmpOp::Ge => 1.0 - below,
            _ => return Err("compares a random draw for equality (probability 0): not a Bernoulli draw Ingot imports".into()),
        };
        let u = self.node(&self.arg(n, side)?, &n.input[side])?;
        let shape = self.g.ty(u).shape.clone();
        let out = n.output.first().ok_or("has no output")?.clone();
        self.bernoulli.insert(out, keep);
        if self.g.mode() == Mode::Eval || keep >= 1.0 {
            return Ok(Some(ir(self.g.full(1.0, shape, DType::Bool))?));
        }
        if keep <= 0.0 {
            return Ok(Some(ir(self.g.full(0.0, shape, DType::Bool))?));
        }
        let ones = ir(self.g.full(1.0, shape, self.float))?;
        let kept = ir(nn::dropout(self.g, &salt, ones, 1.0 - keep))?;
        let zero = ir(self.g.full(0.0, Shape::scalar(), self.float))?;
        Ok(Some(ir(self.g.compare(CmpOp::Ne, kept, zero))?))
    }

    /// Trilu's diagonal offset `k` (input 1, default 0).
    fn trilu_k(&self, n: &NodeProto) -> R<i64> {
        match self.konst_i64s(n, 1)? {
            None => Ok(0),
            Some(v) if v.len() == 1 => Ok(v[0]),
            Some(v) => Err(format!("k must be one integer, got {v:?}")),
        }
    }

    fn constant(&self, at: &Attrs) -> R<Const> {
        if let Some(t) = at.tensor("value") {
            return tensor(t, self.float, &self.dir).map_err(|e| e.to_string());
        }
        if at.has("value_float") {
            return Ok(Const::new(
                self.float,
                vec![],
                Data::F(vec![at.float("value_float", 0.0) as f32 as f64]),
            ));
        }
        if let Some(v) = at.floats("value_floats") {
            return Ok(Const::new(
                self.float,
                vec![v.len()],
                Data::F(v.iter().map(|&x| x as f64).collect()),
            ));
        }
        if at.has("value_int") {
            return Ok(Const::new(
                DType::I64,
                vec![],
                Data::I(vec![at.int("value_int", 0)]),
            ));
        }
        if let Some(v) = at.ints("value_ints") {
            return Ok(Const::i64s(v));
        }
        Err("has no value attribute Ingot reads (value, value_float(s), value_int(s))".into())
    }

    /// Input `i` as a float node.
    fn float_in(&mut self, n: &NodeProto, i: usize) -> R<NodeId> {
        let v = self.arg(n, i)?;
        let v = match v {
            Val::Const(c) if !c.dtype.is_float() => Val::Const(c.cast(self.float)),
            v => v,
        };
        let id = self.node(&v, &n.input[i])?;
        let t = self.g.ty(id);
        if !t.dtype.is_float() {
            return Err(format!("input {i} must be a float tensor, got {t}"));
        }
        Ok(id)
    }

    fn abs(&mut self, x: NodeId) -> R<NodeId> {
        let zero = self.scalar(0.0, x)?;
        let neg = ir(self.g.compare(CmpOp::Lt, x, zero))?;
        let nx = ir(self.g.neg(x))?;
        ir(self.g.select(neg, nx, x))
    }

    /// `1/(1 + e^−x)`, written with `e = exp(−|x|)` (never overflows) as `1/(1 + e)` for
    /// `x >= 0` and `e/(1 + e)` below, so that neither the value nor its gradient is ever
    /// `inf · 0`.
    fn sigmoid(&mut self, x: NodeId) -> R<NodeId> {
        let a = self.abs(x)?;
        let na = ir(self.g.neg(a))?;
        let e = ir(self.g.exp(na))?;
        let e1 = ir(self.g.add_scalar(e, 1.0))?;
        let r = ir(self.g.recip(e1))?;
        let er = ir(self.g.mul(e, r))?;
        let zero = self.scalar(0.0, x)?;
        let pos = ir(self.g.compare(CmpOp::Ge, x, zero))?;
        ir(self.g.select(pos, r, er))
    }

    fn pow(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let e = self
            .konst(n, 1)?
            .and_then(|c| c.scalar())
            .ok_or("the exponent must be one constant value")?;
        let y = match e {
            1.0 => x,
            2.0 => ir(self.g.mul(x, x))?,
            3.0 => {
                let x2 = ir(self.g.mul(x, x))?;
                ir(self.g.mul(x2, x))?
            }
            0.5 => ir(self.g.sqrt(x))?,
            -1.0 => ir(self.g.recip(x))?,
            -0.5 => {
                let s = ir(self.g.sqrt(x))?;
                ir(self.g.recip(s))?
            }
            0.0 => ir(self.g.full_like(1.0, x))?,
            _ => {
                return Err(format!(
                    "exponent {e} needs a pow primitive (Ingot writes exponents 0, ±1, 2, 3, 0.5 and −0.5 exactly)"
                ))
            }
        };
        Ok(vec![Val::Node(y)])
    }

    /// `x` with `rank − its rank` leading axes of size 1.
    fn lift(&mut self, x: NodeId, rank: usize) -> R<NodeId> {
        let d = self.g.ty(x).shape.dims().to_vec();
        if d.len() >= rank {
            return Ok(x);
        }
        let mut nd = vec![1; rank - d.len()];
        nd.extend(d);
        ir(self.g.reshape(x, Shape::new(&nd)))
    }

    fn reshape_val(&mut self, n: &NodeProto, x: Val, shape: &[usize]) -> R<Vec<Val>> {
        let have: usize = self.dims(&x).iter().product();
        if have != shape.iter().product::<usize>() {
            return Err(format!(
                "cannot reshape {:?} ({have} elements) to {shape:?}",
                self.dims(&x)
            ));
        }
        match x {
            Val::Const(c) => Ok(vec![Val::Const(c.reshaped(shape.to_vec()))]),
            v => {
                let id = self.node(&v, &n.input[0])?;
                Ok(vec![Val::Node(ir(self.g.reshape(id, Shape::new(shape)))?)])
            }
        }
    }

    /// `f` applied with `axis` moved last (softmax over any axis).
    fn along_last(
        &mut self,
        x: NodeId,
        axis: usize,
        f: impl FnOnce(&mut Graph, NodeId) -> ingot_compiler::Result<NodeId>,
    ) -> R<NodeId> {
        let r = self.g.ty(x).shape.rank();
        if r == 0 || axis + 1 == r {
            return ir(f(self.g, x));
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.remove(axis);
        perm.push(axis);
        let xt = ir(self.g.transpose(x, &perm))?;
        let y = ir(f(self.g, xt))?;
        let mut back = vec![0; r];
        for (i, &p) in perm.iter().enumerate() {
            back[p] = i;
        }
        ir(self.g.transpose(y, &back))
    }

    fn matmul(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let a = self.float_in(n, 0)?;
        let b = self.float_in(n, 1)?;
        Ok(vec![Val::Node(self.matmul_nodes(a, b)?)])
    }

    /// NumPy's `matmul`: 1-d operands promoted and the added axis removed, batch axes
    /// broadcast; a 2-d right operand under a batched left one is one `[rows, k]` product.
    fn matmul_nodes(&mut self, a: NodeId, b: NodeId) -> R<NodeId> {
        let (da, db) = (
            self.g.ty(a).shape.dims().to_vec(),
            self.g.ty(b).shape.dims().to_vec(),
        );
        if da.is_empty() || db.is_empty() {
            return Err("MatMul does not take scalars".into());
        }
        let a2 = if da.len() == 1 {
            ir(self.g.reshape(a, [1, da[0]]))?
        } else {
            a
        };
        let b2 = if db.len() == 1 {
            ir(self.g.reshape(b, [db[0], 1]))?
        } else {
            b
        };
        let (pa, pb) = (
            self.g.ty(a2).shape.dims().to_vec(),
            self.g.ty(b2).shape.dims().to_vec(),
        );
        let (m, k) = (pa[pa.len() - 2], pa[pa.len() - 1]);
        let (k2, nn_) = (pb[pb.len() - 2], pb[pb.len() - 1]);
        if k != k2 {
            return Err(format!(
                "operands {da:?} and {db:?} do not multiply ({k} ≠ {k2})"
            ));
        }
        let (ba, bb) = (&pa[..pa.len() - 2], &pb[..pb.len() - 2]);
        let batch = broadcast_dims(ba, bb)
            .ok_or_else(|| format!("batch axes of {da:?} and {db:?} do not broadcast"))?;
        let y = if bb.is_empty() && !ba.is_empty() {
            let rows: usize = ba.iter().product::<usize>() * m;
            let a3 = ir(self.g.reshape(a2, [rows, k]))?;
            let y = ir(self.g.matmul(a3, b2))?;
            let mut out = batch.clone();
            out.extend([m, nn_]);
            ir(self.g.reshape(y, Shape::new(&out)))?
        } else {
            let mut sa = batch.clone();
            sa.extend([m, k]);
            let mut sb = batch.clone();
            sb.extend([k, nn_]);
            let a3 = self.lift(a2, sa.len())?;
            let a3 = ir(self.g.broadcast_to(a3, Shape::new(&sa)))?;
            let b3 = self.lift(b2, sb.len())?;
            let b3 = ir(self.g.broadcast_to(b3, Shape::new(&sb)))?;
            ir(self.g.matmul(a3, b3))?
        };
        // Remove the promoted axes.
        let mut out = batch;
        if da.len() > 1 {
            out.push(m);
        }
        if db.len() > 1 {
            out.push(nn_);
        }
        ir(self.g.reshape(y, Shape::new(&out)))
    }

    fn gemm(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let a = self.float_in(n, 0)?;
        let b = self.float_in(n, 1)?;
        for (i, x) in [a, b].into_iter().enumerate() {
            if self.g.ty(x).shape.rank() != 2 {
                return Err(format!("input {i} must be a matrix, got {}", self.g.ty(x)));
            }
        }
        let a = if at.int("transA", 0) != 0 {
            ir(self.g.transpose_last(a))?
        } else {
            a
        };
        let b = if at.int("transB", 0) != 0 {
            ir(self.g.transpose_last(b))?
        } else {
            b
        };
        let mut y = ir(self.g.matmul(a, b))?;
        let alpha = at.float("alpha", 1.0);
        if alpha != 1.0 {
            y = ir(self.g.mul_scalar(y, alpha))?;
        }
        if let Some(c) = self.opt(n, 2)? {
            let beta = at.float("beta", 1.0);
            let c = match c {
                Val::Const(k) => Val::Const(k.cast(self.g.ty(y).dtype)),
                v => v,
            };
            let mut c = self.node(&c, &n.input[2])?;
            if beta != 1.0 {
                c = ir(self.g.mul_scalar(c, beta))?;
            }
            y = ir(self.g.add(y, c))?;
        }
        Ok(vec![Val::Node(y)])
    }

    /// Kernel, strides, symmetric padding and dilations of a 2-d window op over `x`.
    /// `x` as an image: `[N, C, L]` (a 1-d window op) becomes `[N, C, 1, L]`; whether it was.
    fn as_image(&mut self, x: NodeId) -> R<(NodeId, bool)> {
        let d = self.g.ty(x).shape.dims().to_vec();
        match d.len() {
            4 => Ok((x, false)),
            3 => Ok((ir(self.g.reshape(x, [d[0], d[1], 1, d[2]]))?, true)),
            _ => Err(format!(
                "Ingot imports 1-d and 2-d windows over [N, C, L] or [N, C, H, W]; the input is {d:?}"
            )),
        }
    }

    /// A window op's output `[N, C, 1, L]` back as `[N, C, L]` when its input was 1-d.
    fn image_back(&mut self, y: NodeId, one_d: bool) -> R<NodeId> {
        if !one_d {
            return Ok(y);
        }
        let d = self.g.ty(y).shape.dims().to_vec();
        ir(self.g.reshape(y, [d[0], d[1], d[3]]))
    }

    /// Kernel, strides, symmetric padding and dilations of a window op over the image `x`
    /// (`one_d`: the attributes are a 1-d op's, applied along the last axis).
    fn window(&self, at: &Attrs, x: NodeId, kernel: Option<[usize; 2]>, one_d: bool) -> R<Window> {
        let d = self.g.ty(x).shape.dims().to_vec();
        let sp = if one_d { 1 } else { 2 };
        let two = |name: &str, default: usize| -> R<[usize; 2]> {
            match at.ints(name) {
                None => Ok([default; 2]),
                Some(v) if v.len() == sp && v.iter().all(|&x| x >= 0) => Ok(if one_d {
                    [default, v[0] as usize]
                } else {
                    [v[0] as usize, v[1] as usize]
                }),
                Some(v) => Err(format!("{name} {v:?} must be {sp} non-negative size(s)")),
            }
        };
        let k = match (at.ints("kernel_shape"), kernel) {
            (Some(_), _) => two("kernel_shape", 1)?,
            (None, Some(k)) => k,
            (None, None) => return Err("needs kernel_shape".into()),
        };
        if let Some(w) = kernel {
            if w != k {
                return Err(format!(
                    "kernel_shape {k:?} does not match the weight's {w:?}"
                ));
            }
        }
        let s = two("strides", 1)?;
        let dil = two("dilations", 1)?;
        if [k, s, dil].iter().flatten().any(|&v| v == 0) {
            return Err(format!(
                "kernel {k:?}, strides {s:?} and dilations {dil:?} must all be at least 1"
            ));
        }
        let pads = match at.ints("pads") {
            None => [0; 4],
            Some(p) if p.len() == 2 * sp && p.iter().all(|&x| x >= 0) => {
                if one_d {
                    [0, p[0] as usize, 0, p[1] as usize]
                } else {
                    [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
                }
            }
            Some(p) => return Err(format!("pads {p:?} must be {} non-negative sizes", 2 * sp)),
        };
        let pad = match at.string("auto_pad", "NOTSET").as_str() {
            "VALID" => [0, 0],
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut p = [0; 2];
                for i in 0..2 {
                    let (size, st) = (d[2 + i], s[i].max(1));
                    let out = size.div_ceil(st);
                    let total = ((out - 1) * st + (k[i] - 1) * dil[i] + 1).saturating_sub(size);
                    if total % 2 != 0 {
                        return Err(format!(
                            "auto_pad SAME needs {total} padding on axis {} (uneven: needs an explicit pad primitive)",
                            i + 2
                        ));
                    }
                    p[i] = total / 2;
                }
                p
            }
            _ => {
                if pads[0] != pads[2] || pads[1] != pads[3] {
                    return Err(format!(
                        "pads {pads:?} are not symmetric (Ingot's windows pad begin and end equally; an uneven pad needs an explicit pad primitive)"
                    ));
                }
                [pads[0], pads[1]]
            }
        };
        Ok((k, s, pad, dil))
    }

    fn conv(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let (x, one_d) = self.as_image(x)?;
        let w = self.float_in(n, 1)?;
        let w = match self.g.ty(w).shape.dims().to_vec()[..] {
            [o, c, k] if one_d => ir(self.g.reshape(w, [o, c, 1, k]))?,
            _ => w,
        };
        let wd = self.g.ty(w).shape.dims().to_vec();
        if wd.len() != 4 {
            return Err(format!(
                "Ingot imports 1-d and 2-d convolutions; the weight is {wd:?}"
            ));
        }
        let (_, stride, padding, dilation) = self.window(at, x, Some([wd[2], wd[3]]), one_d)?;
        let groups = at.int("group", 1);
        if groups < 1 {
            return Err(format!("group {groups} must be at least 1"));
        }
        let conv = Conv2d {
            stride,
            padding,
            dilation,
            groups: groups as usize,
        };
        let mut y = ir(self.g.conv2d(x, w, conv))?;
        if let Some(b) = self.opt(n, 2)? {
            let b = self.node(&b, &n.input[2])?;
            let b = ir(self.g.reshape(b, [wd[0], 1, 1]))?;
            y = ir(self.g.add(y, b))?;
        }
        Ok(vec![Val::Node(self.image_back(y, one_d)?)])
    }

    /// `x` along `axis` with `begin` elements added before and `end` after (zeros), or
    /// removed where negative.
    fn pad_axis(&mut self, x: NodeId, axis: usize, begin: i64, end: i64) -> R<NodeId> {
        let mut x = x;
        let size = self.g.ty(x).shape.dims()[axis] as i64;
        let (cut_b, cut_e) = ((-begin).max(0), (-end).max(0));
        if cut_b + cut_e >= size {
            return Err(format!(
                "the padding ({begin}, {end}) leaves nothing of an axis of {size}"
            ));
        }
        if cut_b > 0 || cut_e > 0 {
            x = ir(self
                .g
                .slice(x, axis, cut_b as usize, (size - cut_e) as usize))?;
        }
        let (add_b, add_e) = (begin.max(0) as usize, end.max(0) as usize);
        if add_b == 0 && add_e == 0 {
            return Ok(x);
        }
        let dt = self.g.ty(x).dtype;
        let mut parts = Vec::new();
        for (k, first) in [(add_b, true), (add_e, false)] {
            if k == 0 {
                continue;
            }
            let mut d = self.g.ty(x).shape.dims().to_vec();
            d[axis] = k;
            let z = ir(self.g.full(0.0, Shape::new(&d), dt))?;
            if first {
                parts.push(z);
                parts.push(x);
            } else {
                if parts.is_empty() {
                    parts.push(x);
                }
                parts.push(z);
            }
        }
        ir(self.g.concat(&parts, axis))
    }

    /// ConvTranspose (groups, strides, dilations, pads, output_padding; 1-d and 2-d) written
    /// with Ingot's differentiable ops: the input with `stride − 1` zeros between elements,
    /// padded by `(k − 1)·dilation − pad` (cut where negative) and `output_padding` more at the
    /// end, convolved with the kernel flipped in space and with its channel axes swapped
    /// (within each group). This is the transposed convolution's definition; autodiff gives
    /// its gradients (a convolution for the input, the weight's through the same conv).
    fn conv_transpose(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let (x, one_d) = self.as_image(x)?;
        let w = self.float_in(n, 1)?;
        let w = match self.g.ty(w).shape.dims().to_vec()[..] {
            [c, o, k] if one_d => ir(self.g.reshape(w, [c, o, 1, k]))?,
            _ => w,
        };
        let wd = self.g.ty(w).shape.dims().to_vec();
        let xd = self.g.ty(x).shape.dims().to_vec();
        if wd.len() != 4 {
            return Err(format!(
                "Ingot imports 1-d and 2-d transposed convolutions; the weight is {wd:?}"
            ));
        }
        let groups = at.int("group", 1);
        if groups < 1 || !wd[0].is_multiple_of(groups as usize) || xd[1] != wd[0] {
            return Err(format!(
                "group {groups}: the weight {wd:?} must be [C_in, C_out/group, kH, kW] with C_in = the input's {} channels, divisible by the groups",
                xd[1]
            ));
        }
        let gr = groups as usize;
        let sp = if one_d { 1 } else { 2 };
        let two = |name: &str, default: i64| -> R<[i64; 2]> {
            match at.ints(name) {
                None => Ok([default; 2]),
                Some(v) if v.len() == sp && v.iter().all(|&x| x >= 0) => {
                    Ok(if one_d { [default, v[0]] } else { [v[0], v[1]] })
                }
                Some(v) => Err(format!("{name} {v:?} must be {sp} non-negative size(s)")),
            }
        };
        let k = [wd[2] as i64, wd[3] as i64];
        if let Some(ks) = at.ints("kernel_shape") {
            let want: Vec<i64> = if one_d { vec![k[1]] } else { k.to_vec() };
            if ks != want {
                return Err(format!(
                    "kernel_shape {ks:?} does not match the weight's {want:?}"
                ));
            }
        }
        let stride = two("strides", 1)?;
        let dil = two("dilations", 1)?;
        let op = two("output_padding", 0)?;
        if stride.contains(&0) || dil.contains(&0) {
            return Err(format!(
                "strides {stride:?} and dilations {dil:?} must be at least 1"
            ));
        }
        let pads: [i64; 4] = match at.ints("pads") {
            None => [0; 4],
            Some(p) if p.len() == 2 * sp && p.iter().all(|&x| x >= 0) => {
                if one_d {
                    [0, p[0], 0, p[1]]
                } else {
                    [p[0], p[1], p[2], p[3]]
                }
            }
            Some(p) => return Err(format!("pads {p:?} must be {} non-negative sizes", 2 * sp)),
        };
        // Zeros between elements: [N, C, H, W] -> [N, C, H, s, W, s] -> [N, C, Hs, Ws], cut
        // to (H − 1)s + 1.
        let (nb, c, h, wi) = (xd[0], xd[1], xd[2], xd[3]);
        let (sh, sw) = (stride[0] as usize, stride[1] as usize);
        let mut xs = x;
        if sh > 1 || sw > 1 {
            let x6 = ir(self.g.reshape(x, [nb, c, h, 1, wi, 1]))?;
            let x6 = self.pad_axis(x6, 3, 0, sh as i64 - 1)?;
            let x6 = self.pad_axis(x6, 5, 0, sw as i64 - 1)?;
            let x4 = ir(self.g.reshape(x6, [nb, c, h * sh, wi * sw]))?;
            let x4 = ir(self.g.slice(x4, 2, 0, (h - 1) * sh + 1))?;
            xs = ir(self.g.slice(x4, 3, 0, (wi - 1) * sw + 1))?;
        }
        // Padding: symmetric part by the convolution, the rest explicitly.
        let mut padding = [0usize; 2];
        for i in 0..2 {
            let full = (k[i] - 1) * dil[i];
            let (b, e) = (full - pads[i], full - pads[i + 2] + op[i]);
            let common = b.min(e).max(0);
            padding[i] = common as usize;
            xs = self.pad_axis(xs, 2 + i, b - common, e - common)?;
        }
        // The kernel: [C_in, C_out/g, kH, kW] -> [C_out, C_in/g, kH, kW], flipped in space.
        let (cin, cog) = (wd[0], wd[1]);
        let w5 = ir(self.g.reshape(w, [gr, cin / gr, cog, wd[2], wd[3]]))?;
        let w5 = ir(self.g.transpose(w5, &[0, 2, 1, 3, 4]))?;
        let mut wf = ir(self.g.reshape(w5, [gr * cog, cin / gr, wd[2], wd[3]]))?;
        for axis in [2, 3] {
            let size = wd[axis];
            if size > 1 {
                let parts: Vec<NodeId> = (0..size)
                    .rev()
                    .map(|i| ir(self.g.slice(wf, axis, i, i + 1)))
                    .collect::<R<_>>()?;
                wf = ir(self.g.concat(&parts, axis))?;
            }
        }
        let conv = Conv2d {
            stride: [1, 1],
            padding,
            dilation: [dil[0] as usize, dil[1] as usize],
            groups: gr,
        };
        let mut y = ir(self.g.conv2d(xs, wf, conv))?;
        if let Some(b) = self.opt(n, 2)? {
            let b = self.node(&b, &n.input[2])?;
            let b = ir(self.g.reshape(b, [gr * cog, 1, 1]))?;
            y = ir(self.g.add(y, b))?;
        }
        Ok(vec![Val::Node(self.image_back(y, one_d)?)])
    }

    /// Resize by integer factors: `nearest` (each element repeated, which every coordinate
    /// mode with a floor or round gives for an integer factor) and `linear` with `half_pixel`,
    /// `pytorch_half_pixel` or `asymmetric` coordinates (each output element a fixed blend of
    /// an input element and its neighbour, edges clamped), one axis at a time.
    fn resize(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let d = self.g.ty(x).shape.dims().to_vec();
        let factors: Vec<usize> = match (self.konst(n, 2)?, self.konst(n, 3)?) {
            (Some(s), _) if s.numel() > 0 => {
                let s = s.to_f64s();
                if s.len() != d.len() {
                    return Err(format!(
                        "scales {s:?} must have one entry per axis of {d:?}"
                    ));
                }
                s.iter()
                    .map(|&f| {
                        if f >= 1.0 && f.fract() == 0.0 {
                            Ok(f as usize)
                        } else {
                            Err(format!("scale {f} is not a whole number of at least 1 (Ingot resizes by integer factors)"))
                        }
                    })
                    .collect::<R<_>>()?
            }
            (_, Some(z)) => {
                let z = z.to_i64s().ok_or("sizes must be integers")?;
                if z.len() != d.len() {
                    return Err(format!("sizes {z:?} must have one entry per axis of {d:?}"));
                }
                z.iter()
                    .zip(&d)
                    .map(|(&o, &i)| {
                        if o >= i as i64 && o % i as i64 == 0 {
                            Ok((o / i as i64) as usize)
                        } else {
                            Err(format!("size {o} is not a whole multiple of the input's {i} (Ingot resizes by integer factors)"))
                        }
                    })
                    .collect::<R<_>>()?
            }
            _ => return Err("needs scales or sizes".into()),
        };
        let mode = at.string("mode", "nearest");
        let ctm = at.string("coordinate_transformation_mode", "half_pixel");
        let mut y = x;
        for (axis, &s) in factors.iter().enumerate() {
            if s == 1 {
                continue;
            }
            y = match mode.as_str() {
                "nearest" => {
                    let nm = at.string("nearest_mode", "round_prefer_floor");
                    let ok = match ctm.as_str() {
                        "asymmetric" => nm == "floor",
                        "half_pixel" | "pytorch_half_pixel" => {
                            matches!(nm.as_str(), "round_prefer_floor" | "round_prefer_ceil")
                        }
                        _ => false,
                    };
                    if !ok {
                        return Err(format!(
                            "nearest with coordinate_transformation_mode {ctm:?} and nearest_mode {nm:?} does not repeat elements; Ingot imports asymmetric with floor (PyTorch's nn.Upsample) and half_pixel with round_prefer_floor/ceil"
                        ));
                    }
                    self.repeat_axis(y, axis, s)?
                }
                "linear" => {
                    let frac: Vec<f64> = match ctm.as_str() {
                        "half_pixel" | "pytorch_half_pixel" => (0..s)
                            .map(|r| (r as f64 + 0.5) / s as f64 - 0.5)
                            .collect(),
                        "asymmetric" => (0..s).map(|r| r as f64 / s as f64).collect(),
                        _ => {
                            return Err(format!(
                                "linear with coordinate_transformation_mode {ctm:?}: Ingot imports half_pixel, pytorch_half_pixel (PyTorch's align_corners=False) and asymmetric"
                            ))
                        }
                    };
                    self.lerp_axis(y, axis, &frac)?
                }
                m => {
                    return Err(format!(
                        "mode {m:?}: Ingot imports nearest and linear resizing"
                    ))
                }
            };
        }
        Ok(vec![Val::Node(y)])
    }

    /// Each element along `axis` repeated `s` times.
    fn repeat_axis(&mut self, x: NodeId, axis: usize, s: usize) -> R<NodeId> {
        let d = self.g.ty(x).shape.dims().to_vec();
        let mut d1 = d[..=axis].to_vec();
        d1.push(1);
        d1.extend(&d[axis + 1..]);
        let x1 = ir(self.g.reshape(x, Shape::new(&d1)))?;
        let mut d2 = d1.clone();
        d2[axis + 1] = s;
        let x2 = ir(self.g.broadcast_to(x1, Shape::new(&d2)))?;
        let mut out = d.clone();
        out[axis] *= s;
        ir(self.g.reshape(x2, Shape::new(&out)))
    }

    /// Linear upsampling along `axis` by `frac.len()`: output `i·s + r` blends input `i` with
    /// its neighbour at offset `frac[r]` (below when negative), edges clamped.
    fn lerp_axis(&mut self, x: NodeId, axis: usize, frac: &[f64]) -> R<NodeId> {
        let d = self.g.ty(x).shape.dims().to_vec();
        let size = d[axis];
        // x shifted by one either way, the edge element repeated.
        let (next, prev) = if size > 1 {
            let tail = ir(self.g.slice(x, axis, 1, size))?;
            let last = ir(self.g.slice(x, axis, size - 1, size))?;
            let head = ir(self.g.slice(x, axis, 0, size - 1))?;
            let first = ir(self.g.slice(x, axis, 0, 1))?;
            (
                ir(self.g.concat(&[tail, last], axis))?,
                ir(self.g.concat(&[first, head], axis))?,
            )
        } else {
            (x, x)
        };
        let mut d1 = d[..=axis].to_vec();
        d1.push(1);
        d1.extend(&d[axis + 1..]);
        let mut parts = Vec::new();
        for &f in frac {
            let (other, w) = if f < 0.0 { (prev, -f) } else { (next, f) };
            let p = if w == 0.0 {
                x
            } else {
                let a = ir(self.g.mul_scalar(x, 1.0 - w))?;
                let b = ir(self.g.mul_scalar(other, w))?;
                ir(self.g.add(a, b))?
            };
            parts.push(ir(self.g.reshape(p, Shape::new(&d1)))?);
        }
        let y = ir(self.g.concat(&parts, axis + 1))?;
        let mut out = d.clone();
        out[axis] *= frac.len();
        ir(self.g.reshape(y, Shape::new(&out)))
    }

    fn max_pool(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let (x, one_d) = self.as_image(x)?;
        let (kernel, stride, padding, dilation) = self.window(at, x, None, one_d)?;
        let pool = Pool2d {
            kernel,
            stride,
            padding,
            dilation,
        };
        let y = ir(self.g.max_pool2d(x, pool))?;
        Ok(vec![Val::Node(self.image_back(y, one_d)?)])
    }

    /// Average pooling as a convolution of each channel with a constant window; with
    /// `count_include_pad=0` (ONNX's default) and padding, each window's sum is divided by the
    /// number of image elements it covers (a convolution of ones, which rewriting folds).
    fn avg_pool(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let (x, one_d) = self.as_image(x)?;
        let (kernel, stride, padding, _) = self.window(at, x, None, one_d)?;
        let d = self.g.ty(x).shape.dims().to_vec();
        let dt = self.g.ty(x).dtype;
        let (nb, c, h, w) = (d[0], d[1], d[2], d[3]);
        let folded = ir(self.g.reshape(x, [nb * c, 1, h, w]))?;
        let conv = Conv2d {
            stride,
            padding,
            dilation: [1, 1],
            groups: 1,
        };
        let area = (kernel[0] * kernel[1]) as f64;
        let exclude_pad = at.int("count_include_pad", 0) == 0 && padding != [0, 0];
        let y = if exclude_pad {
            let ones = ir(self.g.full(1.0, [1, 1, kernel[0], kernel[1]], dt))?;
            let sums = ir(self.g.conv2d(folded, ones, conv))?;
            let img = ir(self.g.full(1.0, [1, 1, h, w], dt))?;
            let counts = ir(self.g.conv2d(img, ones, conv))?;
            ir(self.g.div(sums, counts))?
        } else {
            let k = ir(self.g.full(1.0 / area, [1, 1, kernel[0], kernel[1]], dt))?;
            ir(self.g.conv2d(folded, k, conv))?
        };
        let o = self.g.ty(y).shape.dims().to_vec();
        let y = ir(self.g.reshape(y, [nb, c, o[2], o[3]]))?;
        Ok(vec![Val::Node(self.image_back(y, one_d)?)])
    }

    /// BatchNormalization over axis 1 of `[N, C, ...]`. Traced in training mode with
    /// `training_mode=1`: normalised by the batch's mean and biased variance, and the running
    /// statistics (inputs 3 and 4, state leaves) updated in place as ONNX specifies
    /// (`r·momentum + s·(1 − momentum)`, with the biased variance as onnxruntime computes);
    /// otherwise, and always in evaluation mode, normalised by the running statistics.
    fn batch_norm(&mut self, n: &NodeProto, at: &Attrs, _name: &str) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let ids: Vec<NodeId> = (1..5).map(|i| self.float_in(n, i)).collect::<R<_>>()?;
        let (scale, bias, rm, rv) = (ids[0], ids[1], ids[2], ids[3]);
        let d = self.g.ty(x).shape.dims().to_vec();
        if d.len() < 2 {
            return Err(format!("needs an input [N, C, ...], got {:?}", d));
        }
        let c = d[1];
        let mut bshape = vec![c];
        bshape.extend(std::iter::repeat_n(1, d.len() - 2));
        for id in &ids {
            if self.g.ty(*id).shape.dims() != [c] {
                return Err(format!(
                    "scale, bias, mean and var must be [{c}], got {}",
                    self.g.ty(*id)
                ));
            }
        }
        let eps = at.float("epsilon", 1e-5);
        let momentum = at.float("momentum", 0.9);
        let train = at.int("training_mode", 0) != 0 && self.g.mode() == Mode::Train;
        let axes: Vec<usize> = std::iter::once(0).chain(2..d.len()).collect();
        let (mean, var, xc) = if train {
            let mean = ir(self.g.mean(x, &axes))?;
            let xc = ir(self.g.sub(x, mean))?;
            let sq = ir(self.g.mul(xc, xc))?;
            let var = ir(self.g.mean(sq, &axes))?;
            (mean, var, xc)
        } else {
            let m = ir(self.g.reshape(rm, Shape::new(&bshape)))?;
            let v = ir(self.g.reshape(rv, Shape::new(&bshape)))?;
            let xc = ir(self.g.sub(x, m))?;
            (m, v, xc)
        };
        let ve = ir(self.g.add_scalar(var, eps))?;
        let sd = ir(self.g.sqrt(ve))?;
        let r = ir(self.g.recip(sd))?;
        let xh = ir(self.g.mul(xc, r))?;
        let s = ir(self.g.reshape(scale, Shape::new(&bshape)))?;
        let b = ir(self.g.reshape(bias, Shape::new(&bshape)))?;
        let y = ir(self.g.mul(xh, s))?;
        let y = ir(self.g.add(y, b))?;
        let mut out = vec![Val::Node(y)];
        if train {
            let upd =
                |g: &mut Graph, state: NodeId, stat: NodeId| -> ingot_compiler::Result<NodeId> {
                    let s = g.reshape(stat, [c])?;
                    let s = g.stop_gradient(s)?;
                    let old = g.mul_scalar(state, momentum)?;
                    let new = g.mul_scalar(s, 1.0 - momentum)?;
                    let v = g.add(old, new)?;
                    if g.leaves(ingot_compiler::ir::LeafKind::State)
                        .contains(&state)
                    {
                        g.set_update(state, v)?;
                    }
                    Ok(v)
                };
            let nm = ir(upd(self.g, rm, mean))?;
            let nv = ir(upd(self.g, rv, var))?;
            out.push(Val::Node(nm));
            out.push(Val::Node(nv));
        } else {
            out.push(Val::Node(rm));
            out.push(Val::Node(rv));
        }
        Ok(out)
    }

    fn layer_norm(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let scale = self.float_in(n, 1)?;
        let d = self.g.ty(x).shape.dims().to_vec();
        let axis = norm_axis(at.int("axis", -1), d.len())?;
        let axes: Vec<usize> = (axis..d.len()).collect();
        let eps = at.float("epsilon", 1e-5);
        let mean = ir(self.g.mean(x, &axes))?;
        let xc = ir(self.g.sub(x, mean))?;
        let sq = ir(self.g.mul(xc, xc))?;
        let var = ir(self.g.mean(sq, &axes))?;
        let ve = ir(self.g.add_scalar(var, eps))?;
        let sd = ir(self.g.sqrt(ve))?;
        let r = ir(self.g.recip(sd))?;
        let xh = ir(self.g.mul(xc, r))?;
        let mut y = ir(self.g.mul(xh, scale))?;
        if let Some(b) = self.opt(n, 2)? {
            let b = match b {
                Val::Const(k) => Val::Const(k.cast(self.g.ty(y).dtype)),
                v => v,
            };
            let b = self.node(&b, &n.input[2])?;
            y = ir(self.g.add(y, b))?;
        }
        Ok(vec![Val::Node(y), Val::Node(mean), Val::Node(r)])
    }

    fn reduce(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let d = self.g.ty(x).shape.dims().to_vec();
        let axes = match self.konst_i64s(n, 1)? {
            Some(a) => Some(a),
            None => at.ints("axes"),
        };
        let axes = match axes {
            Some(a) if !a.is_empty() => norm_axes(&a, d.len())?,
            _ if at.int("noop_with_empty_axes", 0) != 0 => return Ok(vec![Val::Node(x)]),
            _ => (0..d.len()).collect(),
        };
        let y = match n.op_type() {
            "ReduceMean" => ir(self.g.mean(x, &axes))?,
            "ReduceSum" => ir(self.g.sum(x, &axes))?,
            "ReduceMin" => {
                // min x = −max(−x), exactly.
                let nx = ir(self.g.neg(x))?;
                let m = ir(self.g.reduce(ReduceOp::Max, nx, &axes))?;
                ir(self.g.neg(m))?
            }
            _ => ir(self.g.reduce(ReduceOp::Max, x, &axes))?,
        };
        if at.int("keepdims", 1) != 0 {
            return Ok(vec![Val::Node(y)]);
        }
        let kept: Vec<usize> = d
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &s)| s)
            .collect();
        Ok(vec![Val::Node(ir(self.g.reshape(y, Shape::new(&kept)))?)])
    }

    /// `Gather(data, indices, axis)`: the table's `axis` moved first, rows gathered, the
    /// index axes put back where `axis` was. A constant scalar index is a slice.
    fn gather(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let data = self.arg(n, 0)?;
        let idx = self.arg(n, 1)?;
        let d = self.dims(&data);
        let axis = norm_axis(at.int("axis", 0), d.len())?;
        let data = self.node(&data, &n.input[0])?;
        if let Val::Const(c) = &idx {
            let vals = c.to_i64s().ok_or("indices must be integers")?;
            let fixed: Vec<i64> = vals
                .iter()
                .map(|&i| if i < 0 { i + d[axis] as i64 } else { i })
                .collect();
            if let Some(bad) = fixed.iter().find(|&&i| i < 0 || i as usize >= d[axis]) {
                return Err(format!(
                    "index {bad} is out of range for axis {axis} of size {}",
                    d[axis]
                ));
            }
            if c.dims.is_empty() {
                let i = fixed[0] as usize;
                let s = ir(self.g.slice(data, axis, i, i + 1))?;
                let mut out = d.clone();
                out.remove(axis);
                return Ok(vec![Val::Node(ir(self.g.reshape(s, Shape::new(&out)))?)]);
            }
        }
        let idx = match idx {
            Val::Const(c) => {
                let fixed: Vec<i64> = c
                    .to_i64s()
                    .unwrap_or_default()
                    .iter()
                    .map(|&i| if i < 0 { i + d[axis] as i64 } else { i })
                    .collect();
                Val::Const(Const::new(DType::I64, c.dims.clone(), Data::I(fixed)))
            }
            v => v,
        };
        let ids = self.node(&idx, &n.input[1])?;
        let ir_ = self.g.ty(ids).shape.rank();
        let r = d.len();
        let table = if axis == 0 {
            data
        } else {
            let mut perm = vec![axis];
            perm.extend((0..r).filter(|&i| i != axis));
            ir(self.g.transpose(data, &perm))?
        };
        let y = ir(self.g.gather(table, ids))?;
        if axis == 0 {
            return Ok(vec![Val::Node(y)]);
        }
        // y is [idx..., d[0..axis], d[axis+1..]]; the output is [d[0..axis], idx..., d[axis+1..]].
        let mut perm: Vec<usize> = (ir_..ir_ + axis).collect();
        perm.extend(0..ir_);
        perm.extend(ir_ + axis..ir_ + r - 1);
        Ok(vec![Val::Node(ir(self.g.transpose(y, &perm))?)])
    }

    /// Einsum of one or two operands without repeated or ellipsis indices: batch indices (in
    /// both operands and the output), contracted ones (in both, not the output) and free ones,
    /// as one batched matmul between transposes and reshapes.
    fn einsum(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let eq: String = at
            .string("equation", "")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let (lhs, out) = eq
            .split_once("->")
            .ok_or("needs an explicit output (`...->...`)")?;
        let ins: Vec<&str> = lhs.split(',').collect();
        let ok = |s: &str| {
            s.chars().all(|c| c.is_ascii_alphabetic())
                && s.chars().collect::<std::collections::BTreeSet<_>>().len() == s.len()
        };
        if ins.len() != n.input.len() || !ins.iter().chain([&out]).all(|s| ok(s)) {
            return Err(format!(
                "equation {eq:?}: Ingot imports one or two operands with distinct letters per operand and no ellipsis"
            ));
        }
        let a = self.float_in(n, 0)?;
        let pos = |s: &str, c: char| s.find(c);
        if ins.len() == 1 {
            let s = ins[0];
            if !out.chars().all(|c| s.contains(c)) {
                return Err(format!(
                    "equation {eq:?}: output letters must come from the operand"
                ));
            }
            let summed: Vec<usize> = s
                .chars()
                .enumerate()
                .filter(|(_, c)| !out.contains(*c))
                .map(|(i, _)| i)
                .collect();
            let mut x = a;
            let mut rest: String = s.to_string();
            if !summed.is_empty() {
                x = ir(self.g.sum(x, &summed))?;
                rest = s.chars().filter(|c| out.contains(*c)).collect();
                let dims: Vec<usize> = self
                    .g
                    .ty(x)
                    .shape
                    .dims()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !summed.contains(i))
                    .map(|(_, &d)| d)
                    .collect();
                x = ir(self.g.reshape(x, Shape::new(&dims)))?;
            }
            let perm: Vec<usize> = out
                .chars()
                .map(|c| pos(&rest, c).expect("checked"))
                .collect();
            return Ok(vec![Val::Node(ir(self.g.transpose(x, &perm))?)]);
        }
        let b = self.float_in(n, 1)?;
        let (sa, sb) = (ins[0], ins[1]);
        let (da, db) = (
            self.g.ty(a).shape.dims().to_vec(),
            self.g.ty(b).shape.dims().to_vec(),
        );
        if da.len() != sa.len() || db.len() != sb.len() {
            return Err(format!(
                "equation {eq:?} does not match the operands' ranks ({da:?}, {db:?})"
            ));
        }
        let size = |c: char| {
            pos(sa, c)
                .map(|i| da[i])
                .or_else(|| pos(sb, c).map(|i| db[i]))
                .unwrap_or(1)
        };
        let mut batch = String::new();
        let mut contract = String::new();
        let mut fa = String::new();
        let mut fb = String::new();
        for c in sa.chars() {
            match (sb.contains(c), out.contains(c)) {
                (true, true) => batch.push(c),
                (true, false) => contract.push(c),
                (false, true) => fa.push(c),
                (false, false) => {
                    return Err(format!(
                        "equation {eq:?}: index {c} is summed inside one operand (not supported)"
                    ))
                }
            }
        }
        for c in sb.chars() {
            match (sa.contains(c), out.contains(c)) {
                (false, true) => fb.push(c),
                (false, false) => {
                    return Err(format!(
                        "equation {eq:?}: index {c} is summed inside one operand (not supported)"
                    ))
                }
                _ => {}
            }
        }
        if !out.chars().all(|c| sa.contains(c) || sb.contains(c)) {
            return Err(format!(
                "equation {eq:?}: an output index is in neither operand"
            ));
        }
        for c in batch.chars().chain(contract.chars()) {
            if da[pos(sa, c).expect("in a")] != db[pos(sb, c).expect("in b")] {
                return Err(format!("equation {eq:?}: index {c} has different sizes"));
            }
        }
        let prod = |s: &str| s.chars().map(size).product::<usize>();
        let order_a: String = format!("{batch}{fa}{contract}");
        let order_b: String = format!("{batch}{contract}{fb}");
        let pa: Vec<usize> = order_a.chars().map(|c| pos(sa, c).expect("in a")).collect();
        let pb: Vec<usize> = order_b.chars().map(|c| pos(sb, c).expect("in b")).collect();
        let at_ = ir(self.g.transpose(a, &pa))?;
        let bt = ir(self.g.transpose(b, &pb))?;
        let (nb, m, k, nn_) = (prod(&batch), prod(&fa), prod(&contract), prod(&fb));
        let a3 = ir(self.g.reshape(at_, [nb, m, k]))?;
        let b3 = ir(self.g.reshape(bt, [nb, k, nn_]))?;
        let y = ir(self.g.matmul(a3, b3))?;
        let got: String = format!("{batch}{fa}{fb}");
        let dims: Vec<usize> = got.chars().map(size).collect();
        let y = ir(self.g.reshape(y, Shape::new(&dims)))?;
        let perm: Vec<usize> = out
            .chars()
            .map(|c| pos(&got, c).expect("an output index"))
            .collect();
        Ok(vec![Val::Node(ir(self.g.transpose(y, &perm))?)])
    }
}

/// Reshape's target: `0` keeps the input's size (allowzero=0), `-1` takes what is left.
pub fn reshape_dims(input: &[usize], spec: &[i64]) -> R<Vec<usize>> {
    let total: usize = input.iter().product();
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            0 => out.push(*input.get(i).ok_or_else(|| {
                format!("shape {spec:?}: 0 at axis {i} copies an axis the input {input:?} lacks")
            })?),
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            s if s > 0 => out.push(s as usize),
            _ => return Err(format!("shape {spec:?} is not a valid Reshape target")),
        }
    }
    if let Some(i) = infer {
        let known: usize = out.iter().product();
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!("cannot reshape {input:?} to {spec:?}"));
        }
        out[i] = total / known;
    }
    if out.iter().product::<usize>() != total {
        return Err(format!(
            "cannot reshape {input:?} ({total} elements) to {spec:?}"
        ));
    }
    Ok(out)
}

fn squeeze_dims(op: &str, d: &[usize], axes: Option<&[i64]>) -> R<Vec<usize>> {
    if op == "Squeeze" {
        let axes = match axes {
            Some(a) => norm_axes(a, d.len())?,
            None => (0..d.len()).filter(|&i| d[i] == 1).collect(),
        };
        if let Some(&a) = axes.iter().find(|&&a| d[a] != 1) {
            return Err(format!("cannot squeeze axis {a} of size {}", d[a]));
        }
        Ok(d.iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &s)| s)
            .collect())
    } else {
        let axes = axes.ok_or("needs axes")?;
        let r = d.len() + axes.len();
        let axes = norm_axes(axes, r)?;
        let mut it = d.iter();
        Ok((0..r)
            .map(|i| {
                if axes.contains(&i) {
                    1
                } else {
                    *it.next().unwrap_or(&1)
                }
            })
            .collect())
    }
}

fn transpose_perm(perm: Option<Vec<i64>>, r: usize) -> R<Vec<usize>> {
    match perm {
        None => Ok((0..r).rev().collect()),
        Some(p) => {
            let p: Vec<usize> = p.iter().map(|&a| norm_axis(a, r)).collect::<R<_>>()?;
            let mut s = p.clone();
            s.sort_unstable();
            if s != (0..r).collect::<Vec<_>>() {
                return Err(format!("perm {p:?} is not a permutation of {r} axes"));
            }
            Ok(p)
        }
    }
}

fn expand_dims(d: &[usize], shape: &[i64]) -> R<Vec<usize>> {
    if shape.iter().any(|&s| s < 0) {
        return Err(format!("shape {shape:?} has a negative size"));
    }
    let s: Vec<usize> = shape.iter().map(|&x| x as usize).collect();
    broadcast_dims(d, &s).ok_or_else(|| format!("{d:?} does not broadcast to {shape:?}"))
}

fn split_sizes(split: Option<Vec<i64>>, at: &Attrs, outputs: usize, size: usize) -> R<Vec<usize>> {
    let split = split.or_else(|| at.ints("split"));
    if let Some(s) = split {
        if s.iter().any(|&x| x < 0) || s.iter().sum::<i64>() as usize != size {
            return Err(format!(
                "split {s:?} does not add up to the axis size {size}"
            ));
        }
        return Ok(s.iter().map(|&x| x as usize).collect());
    }
    let parts = if at.has("num_outputs") {
        at.int("num_outputs", 1) as usize
    } else {
        outputs
    };
    if parts == 0 {
        return Err("splits into no parts".into());
    }
    let chunk = size.div_ceil(parts);
    Ok((0..parts)
        .map(|i| chunk.min(size.saturating_sub(i * chunk)))
        .collect())
}

/// Slice's picked indices per sliced axis (ONNX's clamping rules, any step).
/// The indices a `Slice` keeps on each axis it slices, by ONNX's rules: a negative start or
/// end counts from the end (adds the dim), then both are clamped (to `0..=dim` for a positive
/// step, to `-1..=dim-1` for a negative one), so `INT64_MAX` and `INT64_MIN` mean "to the
/// end" and "to the start". A list may be empty: shape arithmetic slices a shape to nothing
/// (PyTorch's `unflatten` of the last axis takes `shape[rank:]`, `Slice(shape, [rank],
/// [INT64_MAX])`, and concatenates it); only the caller knows whether an empty result is a
/// constant (fine) or a computed tensor (which Ingot cannot hold at size zero).
fn slice_picks(l: &Lower, n: &NodeProto, d: &[usize]) -> R<Vec<(usize, Vec<usize>)>> {
    let starts = l.konst_i64s(n, 1)?.ok_or("needs starts")?;
    let ends = l.konst_i64s(n, 2)?.ok_or("needs ends")?;
    let axes = match l.konst_i64s(n, 3)? {
        Some(a) => a,
        None => (0..starts.len() as i64).collect(),
    };
    let steps = l.konst_i64s(n, 4)?.unwrap_or(vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps must have one entry per sliced axis".into());
    }
    let mut out = Vec::new();
    for i in 0..starts.len() {
        let axis = norm_axis(axes[i], d.len())?;
        let dim = d[axis] as i64;
        let step = steps[i];
        if step == 0 {
            return Err("a step of 0".into());
        }
        let fix = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        let picks: Vec<usize> = if step > 0 {
            let s = fix(starts[i]).clamp(0, dim);
            let e = fix(ends[i]).clamp(0, dim);
            (s..e).step_by(step as usize).map(|x| x as usize).collect()
        } else {
            let s = fix(starts[i]).clamp(0, dim - 1);
            let e = fix(ends[i]).clamp(-1, dim - 1);
            let mut v = Vec::new();
            let mut k = s;
            while k > e {
                v.push(k as usize);
                k += step;
            }
            v
        };
        out.push((axis, picks));
    }
    Ok(out)
}

impl Lower<'_> {
    /// Evaluates `n` on the host when every input is a constant (or the op only reads its
    /// input's shape); `None` when the op has no host evaluation and must be traced.
    fn fold(&mut self, n: &NodeProto, at: &Attrs) -> R<Option<Vec<Val>>> {
        let op = n.op_type();
        let c = |i: usize| -> R<Const> {
            match self.opt(n, i)? {
                Some(Val::Const(c)) => Ok(c),
                _ => Err(format!("needs input {i}")),
            }
        };
        let out = |k: Const| Ok(Some(vec![Val::Const(k)]));
        let fit = |k: Const| {
            if k.dtype == DType::F32 {
                k.cast(DType::F32)
            } else {
                k
            }
        };
        match op {
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Pow" => {
                let (a, b) = (c(0)?, c(1)?);
                if n.input.len() != 2 {
                    return Ok(None);
                }
                let dt = a.dtype;
                let r = match op {
                    "Add" => zip(&a, &b, dt, |x, y| x + y, |x, y| x.checked_add(y)),
                    "Sub" => zip(&a, &b, dt, |x, y| x - y, |x, y| x.checked_sub(y)),
                    "Mul" => zip(&a, &b, dt, |x, y| x * y, |x, y| x.checked_mul(y)),
                    "Div" => zip(&a, &b, dt, |x, y| x / y, |x, y| x.checked_div(y)),
                    "Max" => zip(&a, &b, dt, f64::max, |x, y| Some(x.max(y))),
                    "Min" => zip(&a, &b, dt, f64::min, |x, y| Some(x.min(y))),
                    _ => zip(&a, &b, dt, f64::powf, |x, y| {
                        u32::try_from(y).ok().and_then(|y| x.checked_pow(y))
                    }),
                };
                out(fit(r.ok_or_else(|| format!("constant operands {:?} and {:?} do not broadcast (or an integer overflow or division by zero)", a.dims, b.dims))?))
            }
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
                let (a, b) = (c(0)?, c(1)?);
                let f: fn(f64, f64) -> bool = match op {
                    "Equal" => |x, y| x == y,
                    "Less" => |x, y| x < y,
                    "Greater" => |x, y| x > y,
                    "LessOrEqual" => |x, y| x <= y,
                    _ => |x, y| x >= y,
                };
                let g: fn(i64, i64) -> bool = match op {
                    "Equal" => |x, y| x == y,
                    "Less" => |x, y| x < y,
                    "Greater" => |x, y| x > y,
                    "LessOrEqual" => |x, y| x <= y,
                    _ => |x, y| x >= y,
                };
                let r = zip(
                    &a,
                    &b,
                    DType::Bool,
                    |x, y| f(x, y) as i64 as f64,
                    |x, y| Some(g(x, y) as i64),
                )
                .ok_or("constant operands do not broadcast")?;
                out(r.cast(DType::Bool))
            }
            "Mod" => {
                let (a, b) = (c(0)?, c(1)?);
                let fmod = at.int("fmod", 0) != 0;
                if a.dtype.is_float() && !fmod {
                    return Err("Mod of floats needs fmod=1 (ONNX's rule)".into());
                }
                // fmod=1: C's fmod (the sign of the dividend, Rust's `%`); fmod=0: the sign of
                // the divisor (Python's `%`, integers only).
                let r = zip(
                    &a,
                    &b,
                    a.dtype,
                    |x, y| x % y,
                    |x, y| {
                        let m = x.checked_rem(y)?;
                        Some(if !fmod && m != 0 && (m < 0) != (y < 0) {
                            m + y
                        } else {
                            m
                        })
                    },
                )
                .ok_or("constant operands do not broadcast, or a division by zero")?;
                out(fit(r))
            }
            "IsNaN" => {
                let a = c(0)?;
                let v: Vec<i64> = a.to_f64s().iter().map(|x| x.is_nan() as i64).collect();
                out(Const::new(DType::Bool, a.dims.clone(), Data::I(v)))
            }
            "GatherElements" => {
                let (data, idx) = (c(0)?, c(1)?);
                let r = data.dims.len();
                let axis = norm_axis(at.int("axis", 0), r)?;
                if idx.dims.len() != r {
                    return Err(format!(
                        "indices {:?} must have the rank of the data {:?}",
                        idx.dims, data.dims
                    ));
                }
                let ids = idx.to_i64s().ok_or("indices must be integers")?;
                let (ds, is) = (
                    crate::value::strides(&data.dims),
                    crate::value::strides(&idx.dims),
                );
                let mut picks = Vec::with_capacity(ids.len());
                for (flat, &i) in ids.iter().enumerate() {
                    let size = data.dims[axis] as i64;
                    let j = if i < 0 { i + size } else { i };
                    if j < 0 || j >= size {
                        return Err(format!(
                            "index {i} is out of range for axis {axis} of size {size}"
                        ));
                    }
                    let mut src = 0;
                    for k in 0..r {
                        let pos = (flat / is[k]) % idx.dims[k];
                        if k != axis && pos >= data.dims[k] {
                            return Err(format!(
                                "indices {:?} are larger than the data {:?} on axis {k}",
                                idx.dims, data.dims
                            ));
                        }
                        src += if k == axis { j as usize } else { pos } * ds[k];
                    }
                    picks.push(src);
                }
                let flat = data.reshaped(vec![data.numel()]).sliced(0, &picks);
                out(flat.reshaped(idx.dims.clone()))
            }
            "Not" => {
                let a = c(0)?;
                let v: Vec<i64> = a.to_f64s().iter().map(|&x| (x == 0.0) as i64).collect();
                out(Const::new(DType::Bool, a.dims.clone(), Data::I(v)))
            }
            "Neg" | "Sqrt" | "Exp" | "Log" | "Reciprocal" | "Floor" | "Ceil" | "Abs" | "Tanh" => {
                let a = c(0)?;
                if let (Data::I(v), "Neg" | "Abs" | "Floor" | "Ceil") = (&a.data, op) {
                    let v = v.iter().map(|&x| match op {
                        "Neg" => -x,
                        "Abs" => x.abs(),
                        _ => x,
                    });
                    return out(Const::new(a.dtype, a.dims.clone(), Data::I(v.collect())));
                }
                let f: fn(f64) -> f64 = match op {
                    "Neg" => |x| -x,
                    "Sqrt" => f64::sqrt,
                    "Exp" => f64::exp,
                    "Log" => f64::ln,
                    "Reciprocal" => |x| 1.0 / x,
                    "Floor" => f64::floor,
                    "Ceil" => f64::ceil,
                    "Abs" => f64::abs,
                    _ => f64::tanh,
                };
                let v = a.to_f64s().into_iter().map(f).collect();
                out(fit(Const::new(a.dtype, a.dims.clone(), Data::F(v))))
            }
            "Where" => {
                let (k, a, b) = (c(0)?, c(1)?, c(2)?);
                let dims = broadcast_dims(&k.dims, &a.dims)
                    .and_then(|d| broadcast_dims(&d, &b.dims))
                    .ok_or("constant operands do not broadcast")?;
                let (k, a, b) = (k.broadcast(&dims), a.broadcast(&dims), b.broadcast(&dims));
                let data = match (&a.data, &b.data) {
                    (Data::I(x), Data::I(y)) => Data::I(
                        (0..x.len())
                            .map(|i| if k.data.f64_at(i) != 0.0 { x[i] } else { y[i] })
                            .collect(),
                    ),
                    _ => Data::F(
                        (0..a.numel())
                            .map(|i| {
                                if k.data.f64_at(i) != 0.0 {
                                    a.data.f64_at(i)
                                } else {
                                    b.data.f64_at(i)
                                }
                            })
                            .collect(),
                    ),
                };
                out(Const::new(a.dtype, dims, data))
            }
            "Cast" => out(c(0)?.cast(dtype_of(at.int("to", 0) as i32, self.float)?)),
            "Range" => {
                let (s, l, d) = (c(0)?, c(1)?, c(2)?);
                let (s, l, d) = (
                    s.scalar().ok_or("start must be a scalar")?,
                    l.scalar().ok_or("limit must be a scalar")?,
                    d.scalar().ok_or("delta must be a scalar")?,
                );
                if d == 0.0 {
                    return Err("delta is 0".into());
                }
                let count = ((l - s) / d).ceil().max(0.0) as usize;
                if count > MAX_FOLDED {
                    return Err(format!("Range of {count} elements is too large"));
                }
                let dt = c(0)?.dtype;
                let data = if dt.is_int() {
                    Data::I((0..count).map(|i| (s + i as f64 * d) as i64).collect())
                } else {
                    Data::F((0..count).map(|i| s + i as f64 * d).collect())
                };
                out(fit(Const::new(dt, vec![count], data)))
            }
            "ConstantOfShape" => {
                let shape = c(0)?.to_i64s().ok_or("the shape must be integers")?;
                if shape.iter().any(|&s| s < 0) {
                    return Err(format!("shape {shape:?} has a negative size"));
                }
                let dims: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
                let count = dims
                    .iter()
                    .try_fold(1usize, |a, &d| a.checked_mul(d))
                    .filter(|&c| c <= MAX_FOLDED)
                    .ok_or("too large")?;
                let v = match at.tensor("value") {
                    Some(t) => tensor(t, self.float, &self.dir).map_err(|e| e.to_string())?,
                    None => Const::new(self.float, vec![1], Data::F(vec![0.0])),
                };
                let data = match &v.data {
                    Data::I(x) => Data::I(vec![*x.first().ok_or("value is empty")?; count]),
                    Data::F(x) => Data::F(vec![*x.first().ok_or("value is empty")?; count]),
                };
                out(Const::new(v.dtype, dims, data))
            }
            "Identity" => out(c(0)?),
            "Trilu" => {
                let a = c(0)?;
                let k = self.trilu_k(n)?;
                let r = a.dims.len();
                if r < 2 {
                    return Err(format!("needs at least two axes, got {:?}", a.dims));
                }
                let (rows, cols) = (a.dims[r - 2], a.dims[r - 1]);
                let upper = at.int("upper", 1) != 0;
                let keep = |flat: usize| {
                    let (i, j) = (((flat / cols) % rows) as i64, (flat % cols) as i64);
                    if upper {
                        j - i >= k
                    } else {
                        j - i <= k
                    }
                };
                let data = match &a.data {
                    Data::I(v) => Data::I(
                        v.iter()
                            .enumerate()
                            .map(|(f, &x)| if keep(f) { x } else { 0 })
                            .collect(),
                    ),
                    Data::F(v) => Data::F(
                        v.iter()
                            .enumerate()
                            .map(|(f, &x)| if keep(f) { x } else { 0.0 })
                            .collect(),
                    ),
                };
                out(Const::new(a.dtype, a.dims.clone(), data))
            }
            "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" | "Split" | "Transpose" | "Expand"
            | "Concat" | "Slice" | "Gather" => self.fold_shape_op(n, at).map(Some),
            _ => Ok(None),
        }
    }

    fn fold_shape_op(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let op = n.op_type();
        let x = match self.arg(n, 0)? {
            Val::Const(c) => c,
            Val::Node(_) => return Err("folding a computed value".into()),
        };
        let d = x.dims.clone();
        let one = |k: Const| Ok(vec![Val::Const(k)]);
        match op {
            "Transpose" => one(x.transposed(&transpose_perm(at.ints("perm"), d.len())?)),
            "Expand" => {
                let shape = self.konst_i64s(n, 1)?.ok_or("needs a shape")?;
                let target = expand_dims(&d, &shape)?;
                if target
                    .iter()
                    .try_fold(1usize, |a, &x| a.checked_mul(x))
                    .is_none_or(|c| c > MAX_FOLDED)
                {
                    return Err(format!("expanding a constant to {target:?} is too large"));
                }
                one(x.broadcast(&target))
            }
            "Concat" => {
                let parts: Vec<Const> = (0..n.input.len())
                    .map(|i| match self.arg(n, i)? {
                        Val::Const(c) => Ok(c),
                        Val::Node(_) => Err("mixed".to_string()),
                    })
                    .collect::<R<_>>()?;
                let axis = norm_axis(at.int("axis", 0), d.len())?;
                for p in &parts {
                    let ok = p.dims.len() == d.len()
                        && (0..d.len()).all(|k| k == axis || p.dims[k] == d[k]);
                    if !ok {
                        return Err(format!(
                            "parts {:?} and {:?} do not join on axis {axis}",
                            d, p.dims
                        ));
                    }
                }
                one(Const::concat(&parts, axis))
            }
            "Slice" => {
                let mut k = x;
                for (axis, p) in slice_picks(self, n, &d)? {
                    k = k.sliced(axis, &p);
                }
                one(k)
            }
            "Split" => {
                let axis = norm_axis(at.int("axis", 0), d.len())?;
                let sizes = split_sizes(self.konst_i64s(n, 1)?, at, n.output.len(), d[axis])?;
                let mut start = 0;
                let mut outs = Vec::new();
                for s in sizes {
                    let p: Vec<usize> = (start..start + s).collect();
                    outs.push(Val::Const(x.sliced(axis, &p)));
                    start += s;
                }
                Ok(outs)
            }
            "Gather" => {
                let idx = match self.arg(n, 1)? {
                    Val::Const(c) => c,
                    Val::Node(_) => return Err("mixed".into()),
                };
                let axis = norm_axis(at.int("axis", 0), d.len())?;
                let ids = idx.to_i64s().ok_or("indices must be integers")?;
                let mut picks = Vec::new();
                for &i in &ids {
                    let j = if i < 0 { i + d[axis] as i64 } else { i };
                    if j < 0 || j as usize >= d[axis] {
                        return Err(format!(
                            "index {i} is out of range for axis {axis} of size {}",
                            d[axis]
                        ));
                    }
                    picks.push(j as usize);
                }
                let g = x.sliced(axis, &picks);
                let mut dims = d[..axis].to_vec();
                dims.extend(&idx.dims);
                dims.extend(&d[axis + 1..]);
                one(g.reshaped(dims))
            }
            _ => {
                let lowered = self.lower_shape_only(n, at, x)?;
                Ok(lowered)
            }
        }
    }

    fn lower_shape_only(&mut self, n: &NodeProto, at: &Attrs, x: Const) -> R<Vec<Val>> {
        let d = x.dims.clone();
        let shape = match n.op_type() {
            "Reshape" => reshape_dims(&d, &self.konst_i64s(n, 1)?.ok_or("needs a shape")?)?,
            "Flatten" => {
                let axis = at.int("axis", 1);
                let a = if axis < 0 {
                    axis + d.len() as i64
                } else {
                    axis
                } as usize;
                if a > d.len() {
                    return Err(format!("axis {axis} is out of range"));
                }
                vec![d[..a].iter().product(), d[a..].iter().product()]
            }
            op => {
                let axes = match self.konst_i64s(n, 1)? {
                    Some(a) => Some(a),
                    None => at.ints("axes"),
                };
                squeeze_dims(op, &d, axes.as_deref())?
            }
        };
        Ok(vec![Val::Const(x.reshaped(shape))])
    }
}
