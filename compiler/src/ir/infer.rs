//! Shape and dtype inference: the single source of truth for what each op accepts. The builder
//! calls it as each node is added, the verifier calls it again on a finished graph, and the
//! text parser calls it on every line, so a graph that exists is a graph that type-checks.

use super::{Axes, BinaryOp, DType, Init, Op, ReduceOp, Shape, TensorType, UnaryOp};
use crate::error::IrError;

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
    let fail = |reason: String| IrError::Type {
        op: op.name(),
        node,
        operands: describe(operands),
        reason,
    };
    let arity = |n: usize| -> Result<(), IrError> {
        if operands.len() == n {
            Ok(())
        } else {
            Err(fail(format!(
                "takes {n} operand(s), got {}",
                operands.len()
            )))
        }
    };
    let need_declared = || -> Result<&TensorType, IrError> {
        declared.ok_or_else(|| fail("needs its result type stated".into()))
    };
    // Sizes are multiplied everywhere downstream (planning, allocation): a type whose byte
    // size does not fit is refused here, where the op and the shape can be named.
    let too_large = |t: &TensorType| {
        fail(format!(
            "{t} holds more bytes than any allocation can ({} elements of {} bytes overflow the address space)",
            t.shape.dims().iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" x "),
            t.dtype.size()
        ))
    };
    if let Some(d) = declared.filter(|d| d.checked_bytes().is_none()) {
        return Err(too_large(d));
    }
    let inferred = match op {
        Op::Leaf { name, init, kind } => {
            arity(0)?;
            if name.is_empty() {
                return Err(fail("a leaf needs a non-empty name".into()));
            }
            if let Init::Uniform { bound } = init {
                if !(bound.is_finite() && *bound >= 0.0) {
                    return Err(fail(format!(
                        "init=uniform({bound}): the bound must be a finite number >= 0"
                    )));
                }
            }
            if let Init::Ids { bound } = init {
                let int_input = *kind == crate::ir::LeafKind::Input
                    && declared.is_some_and(|d| d.dtype.is_int());
                if *bound == 0 || !int_input {
                    return Err(fail(format!(
                        "init=ids({bound}) declares the ids of an integer input (bound >= 1), not of this leaf"
                    )));
                }
            }
            if let Init::Normal { std } = init {
                if !(std.is_finite() && *std >= 0.0) {
                    return Err(fail(format!(
                        "init=normal({std}): the standard deviation must be a finite number >= 0"
                    )));
                }
            }
            need_declared()?.clone()
        }
        Op::Full { value } => {
            arity(0)?;
            let t = need_declared()?;
            if !value.is_finite() && !t.dtype.is_float() {
                return Err(fail(format!("{value} is not representable in {}", t.dtype)));
            }
            t.clone()
        }
        Op::Iota { axis } => {
            arity(0)?;
            let t = need_declared()?;
            if *axis >= t.shape.rank() {
                return Err(fail(format!("axis {axis} out of range for {t}")));
            }
            if t.dtype == DType::Bool {
                return Err(fail("iota cannot produce bool".into()));
            }
            t.clone()
        }
        Op::Dropout { p, .. } => {
            arity(2)?;
            let (x, seed) = (operands[0], operands[1]);
            if !matches!(x.dtype, DType::F32 | DType::F64 | DType::BF16) {
                return Err(fail(format!("x must be f32, f64 or bf16, not {}", x.dtype)));
            }
            if seed.dtype != DType::I64 || seed.shape.rank() != 0 {
                return Err(fail(format!(
                    "the seed must be an i64 scalar (the step's seed input), not {seed}"
                )));
            }
            if !(0.0..=1.0).contains(p) {
                return Err(fail(format!("p = {p} is not a probability in [0, 1]")));
            }
            x.clone()
        }
        Op::Unary(u) => {
            arity(1)?;
            let a = operands[0];
            let ok = match u {
                UnaryOp::Neg => a.dtype != DType::Bool,
                _ => a.dtype.is_float(),
            };
            if !ok {
                return Err(fail(format!("not defined for {}", a.dtype)));
            }
            a.clone()
        }
        Op::Binary(b) => {
            arity(2)?;
            let (a, c) = (operands[0], operands[1]);
            same_type(a, c).map_err(&fail)?;
            if a.dtype == DType::Bool {
                return Err(fail("arithmetic is not defined for bool".into()));
            }
            if matches!(b, BinaryOp::Div) && !a.dtype.is_float() {
                return Err(fail(format!(
                    "div is only defined for floats, not {}",
                    a.dtype
                )));
            }
            a.clone()
        }
        Op::Compare(_) => {
            arity(2)?;
            same_type(operands[0], operands[1]).map_err(&fail)?;
            TensorType::new(operands[0].shape.clone(), DType::Bool)
        }
        Op::Select => {
            arity(3)?;
            let (c, a, b) = (operands[0], operands[1], operands[2]);
            if c.dtype != DType::Bool {
                return Err(fail(format!("condition must be bool, got {}", c.dtype)));
            }
            if c.shape != a.shape {
                return Err(fail(format!(
                    "condition shape {} differs from {}",
                    c.shape, a.shape
                )));
            }
            same_type(a, b).map_err(&fail)?;
            a.clone()
        }
        Op::Broadcast => {
            arity(1)?;
            let a = operands[0];
            let t = need_declared()?;
            if t.dtype != a.dtype {
                return Err(fail(format!(
                    "cannot change dtype {} to {}",
                    a.dtype, t.dtype
                )));
            }
            let (src, dst) = (a.shape.dims(), t.shape.dims());
            if src.len() > dst.len() {
                return Err(fail(format!(
                    "cannot broadcast {} to fewer axes {}",
                    a.shape, t.shape
                )));
            }
            let off = dst.len() - src.len();
            for (i, &s) in src.iter().enumerate() {
                if s != 1 && s != dst[off + i] {
                    return Err(fail(format!(
                        "cannot broadcast {} to {}: axis {i} has size {s}, target {}",
                        a.shape,
                        t.shape,
                        dst[off + i]
                    )));
                }
            }
            t.clone()
        }
        Op::Reshape => {
            arity(1)?;
            let a = operands[0];
            let t = need_declared()?;
            if t.dtype != a.dtype {
                return Err(fail(format!(
                    "cannot change dtype {} to {}",
                    a.dtype, t.dtype
                )));
            }
            if t.shape.numel() != a.shape.numel() {
                return Err(fail(format!(
                    "cannot reshape {} ({} elements) to {} ({} elements)",
                    a.shape,
                    a.shape.numel(),
                    t.shape,
                    t.shape.numel()
                )));
            }
            t.clone()
        }
        Op::Transpose { perm } => {
            arity(1)?;
            let a = operands[0];
            check_permutation(perm, a.shape.rank()).map_err(&fail)?;
            let dims: Vec<usize> = perm.iter().map(|&p| a.shape.dims()[p]).collect();
            TensorType::new(Shape::new(&dims), a.dtype)
        }
        Op::Slice { axis, start, end } => {
            arity(1)?;
            let a = operands[0];
            if *axis >= a.shape.rank() {
                return Err(fail(format!("axis {axis} out of range for {}", a.shape)));
            }
            let n = a.shape.dims()[*axis];
            if start >= end || *end > n {
                return Err(fail(format!(
                    "range [{start}, {end}) is empty or outside axis {axis} of size {n}"
                )));
            }
            let mut dims = a.shape.0.clone();
            dims[*axis] = end - start;
            TensorType::new(Shape(dims), a.dtype)
        }
        Op::Concat { axis } => {
            if operands.is_empty() {
                return Err(fail("needs at least one operand".into()));
            }
            let first = operands[0];
            if *axis >= first.shape.rank() {
                return Err(fail(format!(
                    "axis {axis} out of range for {}",
                    first.shape
                )));
            }
            let mut total = 0;
            for o in operands {
                let same_other_axes = o.shape.rank() == first.shape.rank()
                    && (0..o.shape.rank())
                        .all(|i| i == *axis || o.shape.dims()[i] == first.shape.dims()[i]);
                if o.dtype != first.dtype || !same_other_axes {
                    return Err(fail(format!(
                        "operands must agree on dtype and on every axis but {axis}"
                    )));
                }
                total += o.shape.dims()[*axis];
            }
            let mut dims = first.shape.0.clone();
            dims[*axis] = total;
            TensorType::new(Shape(dims), first.dtype)
        }
        Op::Reduce { op: r, axes } => {
            arity(1)?;
            let a = operands[0];
            if a.dtype == DType::Bool {
                return Err(fail("cannot reduce bool".into()));
            }
            check_axes(axes, a.shape.rank()).map_err(&fail)?;
            if axes.is_empty() {
                return Err(fail("needs at least one axis".into()));
            }
            if matches!(r, ReduceOp::Max) && axes.iter().any(|&x| a.shape.dims()[x] == 0) {
                return Err(fail("max over an empty axis".into()));
            }
            let mut dims = a.shape.0.clone();
            for &x in axes {
                dims[x] = 1;
            }
            TensorType::new(Shape(dims), a.dtype)
        }
        Op::MatMul { ta, tb } => {
            arity(2)?;
            let (a, b) = (operands[0], operands[1]);
            if !a.dtype.is_float() || a.dtype != b.dtype {
                return Err(fail("operands must share one float dtype".into()));
            }
            let (ra, rb) = (a.shape.rank(), b.shape.rank());
            if ra < 2 || ra != rb {
                return Err(fail("operands must have the same rank, at least 2".into()));
            }
            let (ad, bd) = (a.shape.dims(), b.shape.dims());
            if ad[..ra - 2] != bd[..rb - 2] {
                return Err(fail("batch axes differ".into()));
            }
            // The matrix dimensions each operand presents after its optional transpose.
            let (m, ka) = matrix_dims(ad, *ta);
            let (kb, n) = matrix_dims(bd, *tb);
            if ka != kb {
                return Err(fail(format!("inner dimensions {ka} and {kb} differ")));
            }
            let mut dims = a.shape.0.clone();
            dims[ra - 2] = m;
            dims[ra - 1] = n;
            TensorType::new(Shape(dims), a.dtype)
        }
        Op::MatMulAcc { ta, tb } => {
            arity(3)?;
            let product = infer(&Op::MatMul { ta: *ta, tb: *tb }, &operands[1..], None, node)
                .map_err(|e| match e {
                    IrError::Type { reason, .. } => fail(format!("a·b: {reason}")),
                    e => e,
                })?;
            let c = operands[0];
            if c.shape != product.shape {
                return Err(fail(format!(
                    "the accumulator c is {c}, the product a·b is {product}: their shapes differ"
                )));
            }
            let widens =
                c.dtype == product.dtype || (product.dtype == DType::BF16 && c.dtype == DType::F32);
            if !widens {
                return Err(fail(format!(
                    "a·b of {} cannot be accumulated into c of {}: c must be of the operands' \
                     dtype, or f32 for bf16 operands",
                    product.dtype, c.dtype
                )));
            }
            c.clone()
        }
        Op::Gather => {
            arity(2)?;
            let (table, ids) = (operands[0], operands[1]);
            if !ids.dtype.is_int() {
                return Err(fail(format!("ids must be i32 or i64, got {}", ids.dtype)));
            }
            if table.shape.rank() < 1 {
                return Err(fail("table must have at least one axis".into()));
            }
            let mut dims = ids.shape.0.clone();
            dims.extend_from_slice(&table.shape.dims()[1..]);
            TensorType::new(Shape(dims), table.dtype)
        }
        Op::ScatterAdd { rows } => {
            arity(2)?;
            let (ids, vals) = (operands[0], operands[1]);
            if !ids.dtype.is_int() {
                return Err(fail(format!("ids must be i32 or i64, got {}", ids.dtype)));
            }
            if vals.dtype == DType::Bool {
                return Err(fail("cannot accumulate bool".into()));
            }
            let k = ids.shape.rank();
            if vals.shape.rank() < k || vals.shape.dims()[..k] != *ids.shape.dims() {
                return Err(fail("values must start with the ids' shape".into()));
            }
            let mut dims: Axes = Axes::new();
            dims.push(*rows);
            dims.extend_from_slice(&vals.shape.dims()[k..]);
            // bf16 rows may be summed into f32, stated as the result's type: the sum is kept
            // unrounded (a data-parallel step's gathered bf16 rows, summed into an f32
            // gradient, reading the bf16 bytes rather than an f32 copy).
            let dtype = match declared {
                Some(d) if vals.dtype == DType::BF16 && d.dtype == DType::F32 => DType::F32,
                _ => vals.dtype,
            };
            TensorType::new(Shape(dims), dtype)
        }
        Op::StopGradient => {
            arity(1)?;
            operands[0].clone()
        }
        Op::Fused(k) => {
            k.check().map_err(|e| fail(e.to_string()))?;
            arity(k.inputs.len())?;
            for (i, (t, input)) in operands.iter().zip(&k.inputs).enumerate() {
                if t.dtype != input.dtype || t.shape.numel() != input.len {
                    return Err(fail(format!(
                        "operand {i} is {t}, but the kernel reads {} elements of {}",
                        input.len, input.dtype
                    )));
                }
            }
            if k.outputs.is_empty() {
                return Err(fail("the kernel has no outputs".into()));
            }
            TensorType::new(Shape::new(&k.output_dims(0)), k.output_dtype(0))
        }
        Op::Result { index } => {
            arity(1)?;
            if *index == 0 {
                return Err(fail("output 0 is the fused node itself".into()));
            }
            need_declared()?.clone()
        }
        Op::Attention { .. } | Op::AttentionGrad { .. } => {
            let mut outs = super::attention_outputs(op, operands).map_err(&fail)?;
            outs.swap_remove(0)
        }
        Op::Convert => {
            arity(1)?;
            let t = need_declared()?;
            if t.shape != operands[0].shape {
                return Err(fail(format!(
                    "cannot change shape {} to {}",
                    operands[0].shape, t.shape
                )));
            }
            t.clone()
        }
        Op::Window(w) => w.infer(operands).map_err(&fail)?,
        Op::AllReduce { ranks } => bucket("an all-reduce", *ranks, operands)
            .map_err(&fail)?
            .clone(),
        Op::AllGather { ranks } => {
            if *ranks < 2 {
                return Err(fail(format!(
                    "an all-gather over {ranks} rank(s) is the identity; it needs ranks >= 2"
                )));
            }
            let [x] = operands else {
                return Err(fail(format!(
                    "an all-gather takes one operand, not {}",
                    operands.len()
                )));
            };
            let Some(&n) = x.shape.dims().first() else {
                return Err(fail(format!(
                    "operand {x} is a scalar: ranks are concatenated along axis 0"
                )));
            };
            let Some(rows) = n.checked_mul(*ranks) else {
                return Err(too_large(x));
            };
            let mut dims = x.shape.0.clone();
            dims[0] = rows;
            TensorType::new(Shape(dims), x.dtype)
        }
        Op::ReduceScatter { ranks } => {
            let first = bucket("a reduce-scatter", *ranks, operands).map_err(&fail)?;
            // Every operand is checked, not only the first: output `i` is operand `i`'s rows.
            for (i, t) in operands.iter().enumerate() {
                scattered(t, *ranks)
                    .map_err(|reason| fail(format!("operand {i} is {t}: {reason}")))?;
            }
            scattered(first, *ranks).map_err(&fail)?
        }
    };
    if inferred.checked_bytes().is_none() {
        return Err(too_large(&inferred));
    }
    if let Some(d) = declared {
        if *d != inferred {
            return Err(fail(format!(
                "stated result {d} but the op gives {inferred}"
            )));
        }
    }
    Ok(inferred)
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
