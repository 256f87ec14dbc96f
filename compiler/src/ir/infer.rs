//! Shape and dtype inference: the single source of truth for what each op accepts. The builder
//! calls it as each node is added, the verifier calls it again on a finished graph, and the
//! text parser calls it on every line, so a graph that exists is a graph that type-checks.
//!
//! [`infer`] checks what every op shares (the stated type's size, the inferred type against the
//! stated one) and hands the op to one small function per op family: sources (leaves, constants,
//! iota), elementwise ops, layout ops, reductions, matrix products, gathers and scatters, fused
//! kernels and their results, and collectives.

use super::op::{Axes, Init, LeafKind, Op};
use super::shape::Shape;
use super::tensor_type::TensorType;
use crate::error::IrError;
use ingot_kernels::FusedKernel;
use ingot_kernels::{BinaryOp, DType, ReduceOp, UnaryOp};

/// Infers the result type of `op` applied to `operands`.
///
/// `declared` is the result type the caller states; it is required for ops whose result is not a
/// function of their operands (leaves, constants, iota, broadcast, reshape, convert) and checked
/// against the inferred type for every other op.
pub fn infer(
    op: &Op,
    operands: &[&TensorType],
    declared: Option<&TensorType>,
    node: usize,
) -> Result<TensorType, IrError> {
    let cx = Cx {
        op,
        operands,
        declared,
        node,
    };
    if let Some(d) = declared.filter(|d| d.checked_bytes().is_none()) {
        return Err(cx.too_large(d));
    }
    let inferred = match op {
        Op::Leaf { name, init, kind } => leaf(&cx, name, init, *kind)?,
        Op::Full { value } => full(&cx, *value)?,
        Op::Iota { axis } => iota(&cx, *axis)?,
        Op::Dropout { p, .. } => dropout(&cx, *p)?,
        Op::Unary(u) => unary(&cx, *u)?,
        Op::Binary(b) => binary(&cx, *b)?,
        Op::Compare(_) => compare(&cx)?,
        Op::Select => select(&cx)?,
        Op::Broadcast => broadcast(&cx)?,
        Op::Reshape => reshape(&cx)?,
        Op::Transpose { perm } => transpose(&cx, perm)?,
        Op::Slice { axis, start, end } => slice(&cx, *axis, *start, *end)?,
        Op::Concat { axis } => concat(&cx, *axis)?,
        Op::Convert => convert(&cx)?,
        Op::Reduce { op: r, axes } => reduce(&cx, *r, axes)?,
        Op::MatMul { ta, tb } => matmul(&cx, *ta, *tb)?,
        Op::MatMulAcc { ta, tb } => matmul_acc(&cx, *ta, *tb)?,
        Op::Gather => gather(&cx)?,
        Op::ScatterAdd { rows } => scatter_add(&cx, *rows)?,
        Op::StopGradient => {
            cx.arity(1)?;
            operands[0].clone()
        }
        Op::Fused(k) => fused(&cx, k)?,
        Op::Result { index } => result(&cx, *index)?,
        Op::Attention { .. } | Op::AttentionGrad { .. } => {
            let mut outs =
                super::attention::attention_outputs(op, operands).map_err(|r| cx.fail(r))?;
            outs.swap_remove(0)
        }
        Op::Window(w) => w.infer(operands).map_err(|r| cx.fail(r))?,
        Op::AllReduce { ranks } => bucket("an all-reduce", *ranks, operands)
            .map_err(|r| cx.fail(r))?
            .clone(),
        Op::AllGather { ranks } => all_gather(&cx, *ranks)?,
        Op::ReduceScatter { ranks } => reduce_scatter(&cx, *ranks)?,
    };
    if inferred.checked_bytes().is_none() {
        return Err(cx.too_large(&inferred));
    }
    if let Some(d) = declared {
        if *d != inferred {
            return Err(cx.fail(format!("stated result {d} but the op gives {inferred}")));
        }
    }
    Ok(inferred)
}

/// One inference's question: the op, its operands, the stated result type and the node's
/// index, with the errors that name them.
struct Cx<'a> {
    op: &'a Op,
    operands: &'a [&'a TensorType],
    declared: Option<&'a TensorType>,
    node: usize,
}

impl<'a> Cx<'a> {
    /// The op refused for `reason`, naming the op, the node and the operands.
    fn fail(&self, reason: String) -> IrError {
        IrError::Type {
            op: self.op.name(),
            node: self.node,
            operands: describe(self.operands),
            reason,
        }
    }

    /// Refused unless there are exactly `n` operands.
    fn arity(&self, n: usize) -> Result<(), IrError> {
        if self.operands.len() == n {
            Ok(())
        } else {
            Err(self.fail(format!("takes {n} operand(s), got {}", self.operands.len())))
        }
    }

    /// The stated result type, for an op whose result its operands do not determine.
    fn need_declared(&self) -> Result<&'a TensorType, IrError> {
        self.declared
            .ok_or_else(|| self.fail("needs its result type stated".into()))
    }

    /// Sizes are multiplied everywhere downstream (planning, allocation): a type whose byte
    /// size does not fit is refused here, where the op and the shape can be named.
    fn too_large(&self, t: &TensorType) -> IrError {
        self.fail(format!(
            "{t} holds more bytes than any allocation can ({} elements of {} bytes overflow the address space)",
            t.shape.dims().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" x "),
            t.dtype.size()
        ))
    }
}

// Sources: leaves, constants and iota, whose type is the stated one.

fn leaf(cx: &Cx, name: &str, init: &Init, kind: LeafKind) -> Result<TensorType, IrError> {
    cx.arity(0)?;
    if name.is_empty() {
        return Err(cx.fail("a leaf needs a non-empty name".into()));
    }
    if let Init::Uniform { bound } = init {
        if !(bound.is_finite() && *bound >= 0.0) {
            return Err(cx.fail(format!(
                "init=uniform({bound}): the bound must be a finite number >= 0"
            )));
        }
    }
    if let Init::Ids { bound } = init {
        let int_input = kind == LeafKind::Input && cx.declared.is_some_and(|d| d.dtype.is_int());
        if *bound == 0 || !int_input {
            return Err(cx.fail(format!(
                "init=ids({bound}) declares the ids of an integer input (bound >= 1), not of this leaf"
            )));
        }
    }
    if let Init::Normal { std } = init {
        if !(std.is_finite() && *std >= 0.0) {
            return Err(cx.fail(format!(
                "init=normal({std}): the standard deviation must be a finite number >= 0"
            )));
        }
    }
    Ok(cx.need_declared()?.clone())
}

fn full(cx: &Cx, value: f64) -> Result<TensorType, IrError> {
    cx.arity(0)?;
    let t = cx.need_declared()?;
    if !value.is_finite() && !t.dtype.is_float() {
        return Err(cx.fail(format!("{value} is not representable in {}", t.dtype)));
    }
    Ok(t.clone())
}

fn iota(cx: &Cx, axis: usize) -> Result<TensorType, IrError> {
    cx.arity(0)?;
    let t = cx.need_declared()?;
    if axis >= t.shape.rank() {
        return Err(cx.fail(format!("axis {axis} out of range for {t}")));
    }
    if t.dtype == DType::Bool {
        return Err(cx.fail("iota cannot produce bool".into()));
    }
    Ok(t.clone())
}

// Elementwise ops: the result is shaped as the operands.

fn dropout(cx: &Cx, p: f64) -> Result<TensorType, IrError> {
    cx.arity(2)?;
    let (x, seed) = (cx.operands[0], cx.operands[1]);
    if !matches!(x.dtype, DType::F32 | DType::F64 | DType::BF16) {
        return Err(cx.fail(format!("x must be f32, f64 or bf16, not {}", x.dtype)));
    }
    if seed.dtype != DType::I64 || seed.shape.rank() != 0 {
        return Err(cx.fail(format!(
            "the seed must be an i64 scalar (the step's seed input), not {seed}"
        )));
    }
    if !(0.0..=1.0).contains(&p) {
        return Err(cx.fail(format!("p = {p} is not a probability in [0, 1]")));
    }
    Ok(x.clone())
}

fn unary(cx: &Cx, u: UnaryOp) -> Result<TensorType, IrError> {
    cx.arity(1)?;
    let a = cx.operands[0];
    let ok = match u {
        UnaryOp::Neg => a.dtype != DType::Bool,
        _ => a.dtype.is_float(),
    };
    if !ok {
        return Err(cx.fail(format!("not defined for {}", a.dtype)));
    }
    Ok(a.clone())
}

fn binary(cx: &Cx, b: BinaryOp) -> Result<TensorType, IrError> {
    cx.arity(2)?;
    let (a, c) = (cx.operands[0], cx.operands[1]);
    same_type(a, c).map_err(|r| cx.fail(r))?;
    if a.dtype == DType::Bool {
        return Err(cx.fail("arithmetic is not defined for bool".into()));
    }
    if matches!(b, BinaryOp::Div) && !a.dtype.is_float() {
        return Err(cx.fail(format!("div is only defined for floats, not {}", a.dtype)));
    }
    Ok(a.clone())
}

fn compare(cx: &Cx) -> Result<TensorType, IrError> {
    cx.arity(2)?;
    same_type(cx.operands[0], cx.operands[1]).map_err(|r| cx.fail(r))?;
    Ok(TensorType::new(cx.operands[0].shape.clone(), DType::Bool))
}

fn select(cx: &Cx) -> Result<TensorType, IrError> {
    cx.arity(3)?;
    let (c, a, b) = (cx.operands[0], cx.operands[1], cx.operands[2]);
    if c.dtype != DType::Bool {
        return Err(cx.fail(format!("condition must be bool, got {}", c.dtype)));
    }
    if c.shape != a.shape {
        return Err(cx.fail(format!(
            "condition shape {} differs from {}",
            c.shape, a.shape
        )));
    }
    same_type(a, b).map_err(|r| cx.fail(r))?;
    Ok(a.clone())
}

// Layout ops: the same elements moved, copied or converted.

/// The stated type of a broadcast or reshape, refused if it changes the operand's dtype.
fn same_dtype_declared<'a>(cx: &Cx<'a>) -> Result<(&'a TensorType, &'a TensorType), IrError> {
    cx.arity(1)?;
    let a = cx.operands[0];
    let t = cx.need_declared()?;
    if t.dtype != a.dtype {
        return Err(cx.fail(format!("cannot change dtype {} to {}", a.dtype, t.dtype)));
    }
    Ok((a, t))
}

fn broadcast(cx: &Cx) -> Result<TensorType, IrError> {
    let (a, t) = same_dtype_declared(cx)?;
    let (src, dst) = (a.shape.dims(), t.shape.dims());
    if src.len() > dst.len() {
        return Err(cx.fail(format!(
            "cannot broadcast {} to fewer axes {}",
            a.shape, t.shape
        )));
    }
    let off = dst.len() - src.len();
    for (i, &s) in src.iter().enumerate() {
        if s != 1 && s != dst[off + i] {
            return Err(cx.fail(format!(
                "cannot broadcast {} to {}: axis {i} has size {s}, target {}",
                a.shape,
                t.shape,
                dst[off + i]
            )));
        }
    }
    Ok(t.clone())
}

fn reshape(cx: &Cx) -> Result<TensorType, IrError> {
    let (a, t) = same_dtype_declared(cx)?;
    if t.shape.numel() != a.shape.numel() {
        return Err(cx.fail(format!(
            "cannot reshape {} ({} elements) to {} ({} elements)",
            a.shape,
            a.shape.numel(),
            t.shape,
            t.shape.numel()
        )));
    }
    Ok(t.clone())
}

fn transpose(cx: &Cx, perm: &[usize]) -> Result<TensorType, IrError> {
    cx.arity(1)?;
    let a = cx.operands[0];
    check_permutation(perm, a.shape.rank()).map_err(|r| cx.fail(r))?;
    let dims: Vec<usize> = perm.iter().map(|&p| a.shape.dims()[p]).collect();
    Ok(TensorType::new(Shape::new(&dims), a.dtype))
}

fn slice(cx: &Cx, axis: usize, start: usize, end: usize) -> Result<TensorType, IrError> {
    cx.arity(1)?;
    let a = cx.operands[0];
    if axis >= a.shape.rank() {
        return Err(cx.fail(format!("axis {axis} out of range for {}", a.shape)));
    }
    let n = a.shape.dims()[axis];
    if start >= end || end > n {
        return Err(cx.fail(format!(
            "range [{start}, {end}) is empty or outside axis {axis} of size {n}"
        )));
    }
    let mut dims = a.shape.0.clone();
    dims[axis] = end - start;
    Ok(TensorType::new(Shape(dims), a.dtype))
}

fn concat(cx: &Cx, axis: usize) -> Result<TensorType, IrError> {
    let operands = cx.operands;
    if operands.is_empty() {
        return Err(cx.fail("needs at least one operand".into()));
    }
    let first = operands[0];
    if axis >= first.shape.rank() {
        return Err(cx.fail(format!("axis {axis} out of range for {}", first.shape)));
    }
    let mut total = 0;
    for o in operands {
        let same_other_axes = o.shape.rank() == first.shape.rank()
            && (0..o.shape.rank()).all(|i| i == axis || o.shape.dims()[i] == first.shape.dims()[i]);
        if o.dtype != first.dtype || !same_other_axes {
            return Err(cx.fail(format!(
                "operands must agree on dtype and on every axis but {axis}"
            )));
        }
        total += o.shape.dims()[axis];
    }
    let mut dims = first.shape.0.clone();
    dims[axis] = total;
    Ok(TensorType::new(Shape(dims), first.dtype))
}

fn convert(cx: &Cx) -> Result<TensorType, IrError> {
    cx.arity(1)?;
    let t = cx.need_declared()?;
    if t.shape != cx.operands[0].shape {
        return Err(cx.fail(format!(
            "cannot change shape {} to {}",
            cx.operands[0].shape, t.shape
        )));
    }
    Ok(t.clone())
}

// Reductions and matrix products.

fn reduce(cx: &Cx, r: ReduceOp, axes: &[usize]) -> Result<TensorType, IrError> {
    cx.arity(1)?;
    let a = cx.operands[0];
    if a.dtype == DType::Bool {
        return Err(cx.fail("cannot reduce bool".into()));
    }
    check_axes(axes, a.shape.rank()).map_err(|r| cx.fail(r))?;
    if axes.is_empty() {
        return Err(cx.fail("needs at least one axis".into()));
    }
    if matches!(r, ReduceOp::Max) && axes.iter().any(|&x| a.shape.dims()[x] == 0) {
        return Err(cx.fail("max over an empty axis".into()));
    }
    let mut dims = a.shape.0.clone();
    for &x in axes {
        dims[x] = 1;
    }
    Ok(TensorType::new(Shape(dims), a.dtype))
}

fn matmul(cx: &Cx, ta: bool, tb: bool) -> Result<TensorType, IrError> {
    cx.arity(2)?;
    let (a, b) = (cx.operands[0], cx.operands[1]);
    if !a.dtype.is_float() || a.dtype != b.dtype {
        return Err(cx.fail("operands must share one float dtype".into()));
    }
    let (ra, rb) = (a.shape.rank(), b.shape.rank());
    if ra < 2 || ra != rb {
        return Err(cx.fail("operands must have the same rank, at least 2".into()));
    }
    let (ad, bd) = (a.shape.dims(), b.shape.dims());
    if ad[..ra - 2] != bd[..rb - 2] {
        return Err(cx.fail("batch axes differ".into()));
    }
    // The matrix dimensions each operand presents after its optional transpose.
    let (m, ka) = matrix_dims(ad, ta);
    let (kb, n) = matrix_dims(bd, tb);
    if ka != kb {
        return Err(cx.fail(format!("inner dimensions {ka} and {kb} differ")));
    }
    let mut dims = a.shape.0.clone();
    dims[ra - 2] = m;
    dims[ra - 1] = n;
    Ok(TensorType::new(Shape(dims), a.dtype))
}

fn matmul_acc(cx: &Cx, ta: bool, tb: bool) -> Result<TensorType, IrError> {
    cx.arity(3)?;
    let product =
        infer(&Op::MatMul { ta, tb }, &cx.operands[1..], None, cx.node).map_err(|e| match e {
            IrError::Type { reason, .. } => cx.fail(format!("a·b: {reason}")),
            e => e,
        })?;
    let c = cx.operands[0];
    if c.shape != product.shape {
        return Err(cx.fail(format!(
            "the accumulator c is {c}, the product a·b is {product}: their shapes differ"
        )));
    }
    let widens =
        c.dtype == product.dtype || (product.dtype == DType::BF16 && c.dtype == DType::F32);
    if !widens {
        return Err(cx.fail(format!(
            "a·b of {} cannot be accumulated into c of {}: c must be of the operands' \
             dtype, or f32 for bf16 operands",
            product.dtype, c.dtype
        )));
    }
    Ok(c.clone())
}

// Gathers and scatters of rows by integer ids.

fn gather(cx: &Cx) -> Result<TensorType, IrError> {
    cx.arity(2)?;
    let (table, ids) = (cx.operands[0], cx.operands[1]);
    if !ids.dtype.is_int() {
        return Err(cx.fail(format!("ids must be i32 or i64, got {}", ids.dtype)));
    }
    if table.shape.rank() < 1 {
        return Err(cx.fail("table must have at least one axis".into()));
    }
    let mut dims = ids.shape.0.clone();
    dims.extend_from_slice(&table.shape.dims()[1..]);
    Ok(TensorType::new(Shape(dims), table.dtype))
}

fn scatter_add(cx: &Cx, rows: usize) -> Result<TensorType, IrError> {
    cx.arity(2)?;
    let (ids, vals) = (cx.operands[0], cx.operands[1]);
    if !ids.dtype.is_int() {
        return Err(cx.fail(format!("ids must be i32 or i64, got {}", ids.dtype)));
    }
    if vals.dtype == DType::Bool {
        return Err(cx.fail("cannot accumulate bool".into()));
    }
    let k = ids.shape.rank();
    if vals.shape.rank() < k || vals.shape.dims()[..k] != *ids.shape.dims() {
        return Err(cx.fail("values must start with the ids' shape".into()));
    }
    let mut dims: Axes = Axes::new();
    dims.push(rows);
    dims.extend_from_slice(&vals.shape.dims()[k..]);
    // bf16 rows may be summed into f32, stated as the result's type: the sum is kept
    // unrounded (a data-parallel step's gathered bf16 rows, summed into an f32
    // gradient, reading the bf16 bytes rather than an f32 copy).
    let dtype = match cx.declared {
        Some(d) if vals.dtype == DType::BF16 && d.dtype == DType::F32 => DType::F32,
        _ => vals.dtype,
    };
    Ok(TensorType::new(Shape(dims), dtype))
}

// Fused kernels and their further outputs.

fn fused(cx: &Cx, k: &FusedKernel) -> Result<TensorType, IrError> {
    k.check().map_err(|e| cx.fail(e.to_string()))?;
    cx.arity(k.inputs.len())?;
    for (i, (t, input)) in cx.operands.iter().zip(&k.inputs).enumerate() {
        if t.dtype != input.dtype || t.shape.numel() != input.len {
            return Err(cx.fail(format!(
                "operand {i} is {t}, but the kernel reads {} elements of {}",
                input.len, input.dtype
            )));
        }
    }
    if k.outputs.is_empty() {
        return Err(cx.fail("the kernel has no outputs".into()));
    }
    Ok(TensorType::new(
        Shape::new(&k.output_dims(0)),
        k.output_dtype(0),
    ))
}

fn result(cx: &Cx, index: usize) -> Result<TensorType, IrError> {
    cx.arity(1)?;
    if index == 0 {
        return Err(cx.fail("output 0 is the fused node itself".into()));
    }
    Ok(cx.need_declared()?.clone())
}

// Collectives across ranks.

fn all_gather(cx: &Cx, ranks: usize) -> Result<TensorType, IrError> {
    if ranks < 2 {
        return Err(cx.fail(format!(
            "an all-gather over {ranks} rank(s) is the identity; it needs ranks >= 2"
        )));
    }
    let [x] = cx.operands else {
        return Err(cx.fail(format!(
            "an all-gather takes one operand, not {}",
            cx.operands.len()
        )));
    };
    let Some(&n) = x.shape.dims().first() else {
        return Err(cx.fail(format!(
            "operand {x} is a scalar: ranks are concatenated along axis 0"
        )));
    };
    let Some(rows) = n.checked_mul(ranks) else {
        return Err(cx.too_large(x));
    };
    let mut dims = x.shape.0.clone();
    dims[0] = rows;
    Ok(TensorType::new(Shape(dims), x.dtype))
}

fn reduce_scatter(cx: &Cx, ranks: usize) -> Result<TensorType, IrError> {
    let first = bucket("a reduce-scatter", ranks, cx.operands).map_err(|r| cx.fail(r))?;
    // Every operand is checked, not only the first: output `i` is operand `i`'s rows.
    for (i, t) in cx.operands.iter().enumerate() {
        scattered(t, ranks).map_err(|reason| cx.fail(format!("operand {i} is {t}: {reason}")))?;
    }
    scattered(first, ranks).map_err(|r| cx.fail(r))
}

/// The first operand of a collective over a bucket of gradients (`what`, in the reasons):
/// refused for fewer than two ranks (the identity), no operand, or operands not all of one
/// float dtype.
fn bucket<'t>(
    what: &str,
    ranks: usize,
    operands: &[&'t TensorType],
) -> Result<&'t TensorType, String> {
    if ranks < 2 {
        return Err(format!(
            "{what} over {ranks} rank(s) is the identity; it needs ranks >= 2"
        ));
    }
    let Some(first) = operands.first() else {
        return Err(format!("{what} needs at least one operand"));
    };
    match operands
        .iter()
        .enumerate()
        .find(|(_, t)| t.dtype != first.dtype || !t.dtype.is_float())
    {
        Some((i, t)) => Err(format!(
            "operand {i} is {t}: a bucket is of one float dtype ({} here)",
            first.dtype
        )),
        None => Ok(first),
    }
}

/// One rank's part of `x` in a reduce-scatter over `ranks` ranks: its rows `[n / ranks, ..]`.
/// Refused (the reason) for a scalar and for rows that do not divide by `ranks`, since every
/// rank gets the same number of rows.
pub(super) fn scattered(x: &TensorType, ranks: usize) -> Result<TensorType, String> {
    let Some(&n) = x.shape.dims().first() else {
        return Err("a scalar has no rows to split among the ranks (axis 0)".into());
    };
    if ranks == 0 || n % ranks != 0 {
        return Err(format!("its {n} rows do not divide among {ranks} ranks"));
    }
    let mut dims = x.shape.0.clone();
    dims[0] = n / ranks;
    Ok(TensorType::new(Shape(dims), x.dtype))
}

/// `(rows, columns)` of the matrices in a `dims`-shaped operand, read transposed if `t`.
fn matrix_dims(dims: &[usize], t: bool) -> (usize, usize) {
    let (r, c) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    if t {
        (c, r)
    } else {
        (r, c)
    }
}

fn describe(operands: &[&TensorType]) -> String {
    if operands.is_empty() {
        return "none".into();
    }
    operands
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn same_type(a: &TensorType, b: &TensorType) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!(
            "operands must have one type, got {a} and {b} (broadcast explicitly)"
        ))
    }
}

fn check_permutation(perm: &[usize], rank: usize) -> Result<(), String> {
    let mut seen = vec![false; rank];
    if perm.len() != rank {
        return Err(format!("permutation {perm:?} does not have {rank} axes"));
    }
    for &p in perm {
        if p >= rank || std::mem::replace(&mut seen[p], true) {
            return Err(format!("{perm:?} is not a permutation of 0..{rank}"));
        }
    }
    Ok(())
}

fn check_axes(axes: &[usize], rank: usize) -> Result<(), String> {
    let mut seen = vec![false; rank];
    for &a in axes {
        if a >= rank || std::mem::replace(&mut seen[a], true) {
            return Err(format!(
                "axes {axes:?} are out of range or repeated for rank {rank}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dims: &[usize], dtype: DType) -> TensorType {
        TensorType::new(Shape::new(dims), dtype)
    }

    fn reduce_scatter(ranks: usize, operands: &[TensorType]) -> Result<TensorType, String> {
        let refs: Vec<&TensorType> = operands.iter().collect();
        infer(&Op::ReduceScatter { ranks }, &refs, None, 7).map_err(|e| e.to_string())
    }

    #[test]
    fn a_reduce_scatter_of_8_rows_over_2_ranks_leaves_each_rank_4() {
        assert_eq!(
            reduce_scatter(2, &[t(&[8, 3], DType::F32)]),
            Ok(t(&[4, 3], DType::F32))
        );
        // The node's value is output 0's: operand 0's rows, whatever the others are.
        assert_eq!(
            reduce_scatter(2, &[t(&[6], DType::BF16), t(&[8, 3], DType::BF16)]),
            Ok(t(&[3], DType::BF16))
        );
    }

    #[test]
    fn a_reduce_scatter_is_refused_naming_the_op_and_the_operand_that_cannot_be_split() {
        for (ranks, operands, says) in [
            (
                2,
                vec![t(&[7, 3], DType::F32)],
                "operand 0 is f32[7,3]: its 7 rows do not divide among 2 ranks",
            ),
            (
                2,
                vec![t(&[8], DType::F32), t(&[5, 2], DType::F32)],
                "operand 1 is f32[5,2]",
            ),
            (2, vec![t(&[], DType::F32)], "scalar"),
            (
                2,
                vec![t(&[8], DType::F32), t(&[8], DType::BF16)],
                "one float dtype",
            ),
            (2, vec![t(&[8], DType::I32)], "one float dtype"),
            (1, vec![t(&[8], DType::F32)], "needs ranks >= 2"),
            (2, vec![], "at least one operand"),
        ] {
            let e = reduce_scatter(ranks, &operands).unwrap_err();
            assert!(
                e.contains("reduce_scatter") && e.contains(says),
                "{says}: {e}"
            );
        }
    }
}
