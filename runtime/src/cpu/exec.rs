//! One node at a time: [`exec_node`] computes a node's value from its operands' buffers into a
//! caller-provided output buffer. Both the reference interpreter ([`super::interp`]) and the
//! planned executor call it, so they compute the same bits.
//!
//! # Semantics (as documented on [`Op`])
//! - `full`: the value converted with `as` (saturating for integers), nonzero is `true` for bool.
//! - `iota`: each element's index along the axis, as the output dtype.
//! - unary ops on floats (`neg` on integers too, wrapping); binary ops on floats and integers
//!   (integer `add`/`sub`/`mul` wrap; `div` is float-only); float `max`/`min` propagate NaN
//!   (a NaN operand gives NaN, as PyTorch's `maximum` and XLA's `max`; [`f32::max`] would
//!   drop it).
//! - `compare` gives bool (0 or 1); NaN compares unequal to everything.
//! - `broadcast`: NumPy, right-aligned; `transpose`, `slice`, `concat`, `reshape` move elements.
//! - `reduce`: sum or max over the axes, kept as size 1, in the fixed order documented in
//!   [`ingot_kernels::cpu::reduce`](mod@ingot_kernels::cpu::reduce) (f32 sums accumulate in
//!   f32, cascaded so that they stay accurate at any length; integer sums wrap; max propagates
//!   NaN).
//! - `matmul`: batched, through [`ingot_kernels::cpu::gemm`](mod@ingot_kernels::cpu::gemm),
//!   packed into a workspace.
//! - `matmul_acc(c, a, b)`: `c` copied into the result, then the GEMM adds `a·b` into it
//!   (`beta = 1`, [`accumulate_product`]); bf16 operands are widened to f32, and a bf16
//!   result is summed in f32 and rounded once.
//! - `gather`/`scatter_add`: an id outside `0..rows` is an [`ExecError::IdOutOfRange`] naming
//!   it; `scatter_add` adds the rows of `values` in row-major order of the ids.
//! - `convert`: Rust `as` casts (float to integer truncates toward zero and saturates, NaN gives
//!   0); bool converts to 1 or 0; to bool, nonzero (NaN included) is `true`.
//! - bf16: f32 arithmetic on the widened values, rounded to the nearest bf16 (ties to even) on
//!   store; reductions, matmuls and `scatter_add` accumulate in f32 and round once (see
//!   [`super::bf16`]). Conversions to bf16 round once (`ingot_kernels::dtype::bf16_from_f64`
//!   from f64 and the integers, which go through f64 first); from bf16 they start at its f32.
//!
//! # Memory
//! `exec_node` allocates nothing on the heap, for tensors of rank up to
//! [`ingot_kernels::cpu::INLINE_RANK`]. `matmul` packs its operands into a workspace:
//! [`exec_node_with`] takes it from the caller (the planned executor passes the node's planned
//! workspace, so a step allocates nothing), while [`exec_node`] allocates one per call. Error
//! values allocate their messages.

pub use super::scratch::Scratch;

use super::bf16::{as_f32, widen_into, widening_scratch};
use crate::error::ExecError;
use crate::tensor::{Element, View, ViewMut};
use half::bf16;
use ingot_compiler::ir::{
    BinaryOp, CmpOp, DType, Node, Op, ReduceOp, TensorType, UnaryOp, WindowOp,
};
use ingot_kernels::cpu::{self as k, Dims, Float, Num, ReduceKind, Scalar};
use ingot_kernels::dtype::bf16_from_f64;
use ingot_kernels::rng;
use smallvec::SmallVec;

/// Calls the generic function `f::<T>(args)` with `T` the Rust type of a dtype.
macro_rules! by_dtype {
    ($dtype:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::Bool => $f::<u8>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
        }
    };
}

/// As [`by_dtype`], for the numeric dtypes; bool is an error.
macro_rules! by_num {
    ($dtype:expr, $op:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
            DType::Bool => Err(invalid($op, "not defined for bool")),
            // Reductions and scatter_add on bf16 run widened (see `super::bf16`).
            DType::BF16 => Err(invalid($op, "bf16 runs widened to f32")),
        }
    };
}

/// Computes `node` from its operands into `out`.
///
/// `inputs[i]` holds the elements of operand `i` (row-major), whose type is `input_types[i]`;
/// `out` must hold exactly `node.ty`'s elements. Leaves are not executed (their values are
/// supplied): passing one is an error. Every buffer is checked against its type first, and every
/// shape relation the op relies on is checked before any element is touched, so inconsistent
/// arguments give an error, never a panic.
pub fn exec_node(
    node: &Node,
    inputs: &[View<'_>],
    input_types: &[&TensorType],
    out: ViewMut<'_>,
) -> Result<(), ExecError> {
    exec_node_with(node, inputs, input_types, out, Scratch::Allocate)
}

/// `t` with its dtype f32 where it is bf16.
fn f32_type(t: &TensorType) -> TensorType {
    let dtype = if t.dtype == DType::BF16 {
        DType::F32
    } else {
        t.dtype
    };
    TensorType::new(t.shape.clone(), dtype)
}

/// Runs a reduction, matmul or scatter_add that involves bf16 as its f32 op over widened
/// operands, rounding the f32 result into `out`.
pub fn exec_widened(
    node: &Node,
    inputs: &[View<'_>],
    input_types: &[&TensorType],
    out: ViewMut<'_>,
    scratch: Scratch<'_>,
) -> Result<(), ExecError> {
    let op = node.op.name();
    let mut owned = Vec::new();
    let (mut rest, given) = widening_scratch(
        op,
        scratch,
        ingot_compiler::lower::cpu::widened::regions(&node.ty, input_types),
        &mut owned,
    )?;
    // Inline storage: a planned step allocates nothing (matmul and scatter_add have 2 operands,
    // reductions 1; shapes up to rank 4 are inline too).
    let mut f32_inputs: SmallVec<[View<'_>; 3]> = SmallVec::new();
    for (v, t) in inputs.iter().zip(input_types) {
        match v {
            View::BF16(x) => f32_inputs.push(View::F32(widen_into(&mut rest, x))),
            other => {
                debug_assert_ne!(t.dtype, DType::BF16);
                f32_inputs.push(*other);
            }
        }
    }
    let n = node.ty.shape.numel();
    let (region, tail) = std::mem::take(&mut rest)
        .split_at_mut(ingot_compiler::lower::cpu::widened::round_up(n * 4));
    let result = as_f32(region, n);
    let types: SmallVec<[TensorType; 3]> = input_types.iter().map(|t| f32_type(t)).collect();
    let type_refs: SmallVec<[&TensorType; 3]> = types.iter().collect();
    let f32_node = Node {
        op: node.op.clone(),
        inputs: node.inputs.clone(),
        ty: f32_type(&node.ty),
    };
    // Planned scratch holds the f32 kernel's own workspace after the regions.
    let inner = if given {
        Scratch::Given(tail)
    } else {
        Scratch::Allocate
    };
    exec_node_with(
        &f32_node,
        &f32_inputs,
        &type_refs,
        ViewMut::F32(result),
        inner,
    )?;
    match out {
        ViewMut::BF16(o) => {
            for (o, &x) in o.iter_mut().zip(result.iter()) {
                *o = bf16::from_f32(x);
            }
        }
        ViewMut::F32(o) => o.copy_from_slice(result),
        other => {
            return Err(ExecError::Invalid {
                op,
                reason: format!("a bf16 operand with a {} result", other.dtype()),
            })
        }
    }
    Ok(())
}

/// `(rows, columns)` of the matrices an operand shaped `dims` presents, transposed if `t`.
fn matrix(dims: &[usize], t: bool) -> (usize, usize) {
    let (r, c) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    if t {
        (c, r)
    } else {
        (r, c)
    }
}

/// An error naming the first operand whose buffer is not of its type's dtype and length.
fn check_operands(
    op: &'static str,
    inputs: &[View<'_>],
    input_types: &[&TensorType],
) -> Result<(), ExecError> {
    for (index, (v, t)) in inputs.iter().zip(input_types).enumerate() {
        if v.dtype() != t.dtype || v.len() != t.shape.numel() {
            return Err(ExecError::Operand {
                op,
                index,
                expected: (*t).clone(),
                got_dtype: v.dtype(),
                got_len: v.len(),
            });
        }
    }
    Ok(())
}

/// [`exec_node`] with the kernel's scratch memory given explicitly: planned execution passes
/// the node's planned workspace, so the call allocates nothing.
pub fn exec_node_with(
    node: &Node,
    inputs: &[View<'_>],
    input_types: &[&TensorType],
    out: ViewMut<'_>,
    scratch: Scratch<'_>,
) -> Result<(), ExecError> {
    let op = node.op.name();
    check_buffers(node, inputs, input_types, &out)?;
    if ingot_compiler::lower::cpu::widened::runs_widened(&node.op, &node.ty, input_types) {
        return exec_widened(node, inputs, input_types, out, scratch);
    }
    let cx = Cx {
        op,
        inputs,
        types: input_types,
        ty: &node.ty,
    };
    exec_op(&cx, node, out, scratch)
}

/// Refuses buffers that do not match the node: their count, each operand's dtype and length,
/// and the output's.
fn check_buffers(
    node: &Node,
    inputs: &[View<'_>],
    input_types: &[&TensorType],
    out: &ViewMut<'_>,
) -> Result<(), ExecError> {
    let op = node.op.name();
    if inputs.len() != node.inputs.len() || input_types.len() != node.inputs.len() {
        return Err(invalid(
            op,
            format!(
                "the node has {} operands, but {} buffers and {} types were given",
                node.inputs.len(),
                inputs.len(),
                input_types.len()
            ),
        ));
    }
    check_operands(op, inputs, input_types)?;
    if out.dtype() != node.ty.dtype || out.len() != node.ty.shape.numel() {
        return Err(ExecError::Output {
            op,
            expected: node.ty.clone(),
            got_dtype: out.dtype(),
            got_len: out.len(),
        });
    }
    Ok(())
}

/// Runs `node`'s op, its buffers checked, through the kernel of its op.
fn exec_op(cx: &Cx, node: &Node, out: ViewMut<'_>, scratch: Scratch<'_>) -> Result<(), ExecError> {
    let (op, inputs, input_types) = (cx.op, cx.inputs, cx.types);
    match &node.op {
        Op::Leaf { .. } => Err(invalid(
            op,
            "leaves are not executed: their values are supplied",
        )),
        Op::Full { value } => {
            full(*value, out);
            Ok(())
        }
        Op::Iota { axis } => iota(cx, *axis, out),
        Op::Unary(u) => {
            cx.elementwise(1)?;
            unary(cx, *u, out)
        }
        Op::Binary(b) => {
            cx.elementwise(2)?;
            binary(cx, *b, out)
        }
        Op::Compare(c) => {
            cx.elementwise(2)?;
            by_dtype!(cx.types[0].dtype, compare(cx, *c, out))
        }
        Op::Select => {
            cx.elementwise(3)?;
            by_dtype!(out.dtype(), select(cx, out))
        }
        Op::Convert => {
            cx.elementwise(1)?;
            convert(cx.inputs[0], out);
            Ok(())
        }
        Op::Broadcast => broadcast(cx, out),
        Op::Reshape => reshape(cx, out),
        Op::Transpose { perm } => transpose(cx, perm, out),
        Op::Slice { axis, start, end } => slice(cx, *axis, *start, *end, out),
        Op::Concat { axis } => by_dtype!(out.dtype(), concat(cx, *axis, out)),
        Op::Reduce { op: r, axes } => {
            cx.arity(1)?;
            let kind = match r {
                ReduceOp::Sum => ReduceKind::Sum,
                ReduceOp::Max => ReduceKind::Max,
            };
            by_num!(out.dtype(), op, reduce(cx, kind, axes, out))
        }
        Op::MatMul { ta, tb } => match out {
            ViewMut::F32(o) => matmul(cx, *ta, *tb, o, false, scratch),
            ViewMut::F64(o) => matmul(cx, *ta, *tb, o, false, scratch),
            _ => Err(invalid(op, format!("not defined for {}", node.ty.dtype))),
        },
        Op::MatMulAcc { .. } => {
            cx.arity(3)?;
            if input_types[0] != &node.ty {
                return Err(invalid(
                    op,
                    format!(
                        "the accumulator c is {}, the result {}",
                        input_types[0], node.ty
                    ),
                ));
            }
            let mut out = out;
            copy_into(inputs[0], &mut out);
            accumulate_product(node, &inputs[1..], &input_types[1..], out, scratch)
        }
        Op::StopGradient => {
            cx.elementwise(1)?;
            by_dtype!(
                out.dtype(),
                strided(cx, 0, &[cx.ty.shape.numel()], &[1], out)
            )
        }
        Op::Fused(_) | Op::Result { .. } => Err(invalid(
            op,
            "fused kernels run through `ingot_kernels::fused::cpu`, not node by node",
        )),
        Op::Attention { .. } | Op::AttentionGrad { .. } => Err(invalid(
            op,
            "attention writes several outputs: it runs through `exec_attention`",
        )),
        Op::AllReduce { .. } | Op::AllGather { .. } | Op::ReduceScatter { .. } => Err(invalid(
            op,
            "a collective runs over data-parallel ranks: it runs in a planned step with a \
             collective (`runtime::collective`), not node by node",
        )),
        Op::Gather => by_dtype!(out.dtype(), gather(cx, out)),
        Op::Dropout { p, salt } => dropout(cx, *p, *salt, out),
        Op::ScatterAdd { rows } => by_num!(out.dtype(), op, scatter_add(cx, *rows, out)),
        Op::Window(w) => match out {
            ViewMut::F32(o) => window(cx, w, o, scratch),
            ViewMut::F64(o) => window(cx, w, o, scratch),
            _ => Err(invalid(op, format!("not defined for {}", node.ty.dtype))),
        },
    }
}

/// A broadcast: the operand read with stride 0 along the axes it broadcasts.
fn broadcast(cx: &Cx, out: ViewMut<'_>) -> Result<(), ExecError> {
    let op = cx.op;
    cx.arity(1)?;
    let (src, dst) = (cx.types[0].shape.dims(), cx.ty.shape.dims());
    let strides = k::broadcast_strides(src, dst).ok_or_else(|| {
        invalid(
            op,
            format!(
                "{} does not broadcast to {}",
                cx.types[0].shape, cx.ty.shape
            ),
        )
    })?;
    by_dtype!(out.dtype(), strided(cx, 0, dst, &strides, out))
}

/// A reshape: the operand's elements copied in order.
fn reshape(cx: &Cx, out: ViewMut<'_>) -> Result<(), ExecError> {
    let op = cx.op;
    cx.arity(1)?;
    if cx.types[0].shape.numel() != cx.ty.shape.numel() {
        return Err(invalid(
            op,
            format!("cannot reshape {} to {}", cx.types[0].shape, cx.ty.shape),
        ));
    }
    by_dtype!(
        out.dtype(),
        strided(cx, 0, &[cx.ty.shape.numel()], &[1], out)
    )
}

/// A transpose: the operand read with its strides permuted.
fn transpose(cx: &Cx, perm: &[usize], out: ViewMut<'_>) -> Result<(), ExecError> {
    let op = cx.op;
    cx.arity(1)?;
    let src = cx.types[0].shape.dims();
    let (dims, strides) = k::permuted(src, perm).ok_or_else(|| {
        invalid(
            op,
            format!(
                "{perm:?} is not a permutation of the axes of {}",
                cx.types[0].shape
            ),
        )
    })?;
    cx.expect_dims(&dims)?;
    by_dtype!(out.dtype(), strided(cx, 0, &dims, &strides, out))
}

/// A slice `[start, end)` along `axis`: the operand read from the slice's first element.
fn slice(
    cx: &Cx,
    axis: usize,
    start: usize,
    end: usize,
    out: ViewMut<'_>,
) -> Result<(), ExecError> {
    let op = cx.op;
    cx.arity(1)?;
    let src = cx.types[0].shape.dims();
    if axis >= src.len() || start >= end || end > src[axis] {
        return Err(invalid(
            op,
            format!(
                "range [{start}, {end}) along axis {axis} does not fit {}",
                cx.types[0].shape
            ),
        ));
    }
    let mut dims: Dims = src.iter().copied().collect();
    dims[axis] = end - start;
    cx.expect_dims(&dims)?;
    let strides = k::row_major_strides(src);
    by_dtype!(
        out.dtype(),
        strided(cx, start * strides[axis], &dims, &strides, out)
    )
}

/// Dropout of operand 0 with the seed in operand 1 (one i64).
fn dropout(cx: &Cx, p: f64, salt: u64, out: ViewMut<'_>) -> Result<(), ExecError> {
    let op = cx.op;
    cx.arity(2)?;
    let seed = match cx.inputs[1] {
        View::I64([s]) => *s as u64,
        _ => {
            return Err(invalid(
                op,
                "the seed must be one i64 (the step's seed input)",
            ))
        }
    };
    match (cx.inputs[0], out) {
        (View::F32(x), ViewMut::F32(o)) => rng::dropout_f32(x, o, seed, salt, p),
        (View::F64(x), ViewMut::F64(o)) => rng::dropout_f64(x, o, seed, salt, p),
        _ => return Err(invalid(op, format!("not defined for {}", cx.ty.dtype))),
    }
    Ok(())
}

/// Runs an attention op (`attention`, `attention_grad`) from its operands into all of its
/// outputs through [`ingot_kernels::cpu::attention`]: `outs[i]` is output `i`'s buffer (0 the
/// node's value, then its result nodes'), or `None` for an output no result node names, which
/// is written into the scratch's tail. `scratch` is the node's planned workspace, laid out as
/// [`ingot_compiler::lower::cpu::workspace_bytes`] says, or allocated here.
pub fn exec_attention(
    node: &Node,
    inputs: &[View<'_>],
    input_types: &[&TensorType],
    outs: &mut [Option<ViewMut<'_>>],
    scratch: Scratch<'_>,
) -> Result<(), ExecError> {
    use ingot_compiler::lower::cpu::widened::round_up;
    use k::attention as a;
    let op = node.op.name();
    // Checked without building the outputs' types (a packed operand is of rank 5, and types
    // of rank 5 live on the heap): this runs on every step.
    let (problem, grad) =
        ingot_compiler::ir::attention_check(&node.op, input_types).map_err(|e| invalid(op, e))?;
    let want = problem.output_elems(grad);
    // The outputs' types, for an error message only.
    let expected = |i: usize| {
        ingot_compiler::ir::attention_outputs(&node.op, input_types)
            .map(|mut ts| ts.swap_remove(i))
            .map_err(|e| invalid(op, e))
    };
    if inputs.len() != input_types.len() || outs.len() != want.len() || outs[0].is_none() {
        return Err(invalid(
            op,
            format!(
                "{} operand buffers and {} output slots for {} operands and {} outputs",
                inputs.len(),
                outs.len(),
                input_types.len(),
                want.len()
            ),
        ));
    }
    check_operands(op, inputs, input_types)?;
    for (i, (o, &(dtype, n))) in outs.iter().zip(&want).enumerate() {
        if let Some(o) = o {
            if o.dtype() != dtype || o.len() != n {
                return Err(ExecError::Output {
                    op,
                    expected: expected(i)?,
                    got_dtype: o.dtype(),
                    got_len: o.len(),
                });
            }
        }
    }
    let shape = problem.cpu();
    let starts = problem.operand_starts();
    let f32s = if grad {
        a::backward_scratch_len(&shape)
    } else {
        a::forward_scratch_len(&shape)
    };
    let head = round_up(4 * f32s);
    let need = outs
        .iter()
        .zip(&want)
        .filter(|(o, _)| o.is_none())
        .fold(head, |at, (_, &(dtype, n))| at + round_up(n * dtype.size()));
    let mut owned: Vec<u64>;
    let bytes: &mut [u8] = match scratch {
        Scratch::Given(bytes) => bytes,
        Scratch::Allocate => {
            owned = vec![0; need.div_ceil(8)];
            // SAFETY: the vector's bytes, exclusively borrowed.
            unsafe { std::slice::from_raw_parts_mut(owned.as_mut_ptr() as *mut u8, need) }
        }
    };
    if bytes.len() < need || !(bytes.as_ptr() as usize).is_multiple_of(8) {
        return Err(invalid(
            op,
            format!(
                "the workspace has {} bytes, the kernel needs {need} (8-byte aligned)",
                bytes.len()
            ),
        ));
    }
    let (ws, mut tail) = bytes.split_at_mut(head);
    // SAFETY: aligned (checked; `head` is a multiple of 64), long enough, exclusively borrowed;
    // every bit pattern is an f32.
    let ws = unsafe { std::slice::from_raw_parts_mut(ws.as_mut_ptr() as *mut f32, f32s) };
    let mut views: SmallVec<[ViewMut<'_>; 3]> = SmallVec::new();
    for (o, &(dtype, n)) in outs.iter_mut().zip(&want) {
        views.push(match o {
            Some(v) => reborrow(v),
            None => {
                let (region, rest) =
                    std::mem::take(&mut tail).split_at_mut(round_up(n * dtype.size()));
                tail = rest;
                match dtype {
                    DType::BF16 => {
                        // SAFETY: a region of the scratch of at least `n` bf16s (rounded up
                        // above), 64-byte aligned, exclusively borrowed; every bit pattern is
                        // a bf16.
                        let v = unsafe {
                            std::slice::from_raw_parts_mut(region.as_mut_ptr() as *mut bf16, n)
                        };
                        ViewMut::BF16(v)
                    }
                    _ => {
                        // SAFETY: a region of the scratch of at least `n` f32s (rounded up
                        // above), 64-byte aligned, exclusively borrowed; every bit pattern is
                        // an f32.
                        let v = unsafe {
                            std::slice::from_raw_parts_mut(region.as_mut_ptr() as *mut f32, n)
                        };
                        ViewMut::F32(v)
                    }
                }
            }
        });
    }
    /// q, k, v (their buffers from where each starts: `starts[i]` is (operand, element));
    /// then out, lse, dout after the forward's `n` operands.
    fn run<T: Element + a::Elem>(
        shape: &a::Shape,
        grad: bool,
        starts: [(usize, usize); 3],
        inputs: &[View<'_>],
        outs: &mut [ViewMut<'_>],
        ws: &mut [f32],
    ) -> Option<()> {
        let arg = |i: usize| T::of(inputs[i]);
        let [q, k, v] = starts.map(|(i, e)| arg(i).and_then(|x| x.get(e..)));
        let (q, k, v) = (q?, k?, v?);
        // The forward's operands are the inputs not among out, lse, dout.
        let n = inputs.len() - if grad { 3 } else { 0 };
        if grad {
            let lse = f32::of(inputs[n + 1])?;
            let grads = match outs {
                [dq, dk, dv] => a::Grads::Separate {
                    dq: T::of_mut(reborrow(dq))?,
                    dk: T::of_mut(reborrow(dk))?,
                    dv: T::of_mut(reborrow(dv))?,
                },
                [dqkv] => a::Grads::Packed {
                    dqkv: T::of_mut(reborrow(dqkv))?,
                    starts: starts.map(|(_, e)| e),
                },
                _ => return None,
            };
            a::backward::<T>(shape, [q, k, v, arg(n)?, arg(n + 2)?], lse, grads, ws);
        } else {
            let [out, lse] = outs else { return None };
            a::forward::<T>(
                shape,
                q,
                k,
                v,
                T::of_mut(reborrow(out))?,
                f32::of_mut(reborrow(lse))?,
                ws,
            );
        }
        Some(())
    }
    let ran = match input_types[0].dtype {
        DType::F32 => run::<f32>(&shape, grad, starts, inputs, &mut views, ws),
        DType::BF16 => run::<bf16>(&shape, grad, starts, inputs, &mut views, ws),
        _ => None,
    };
    ran.ok_or_else(|| invalid(op, "buffers of the wrong dtype (checked above: a bug)"))
}

/// A shorter-lived `ViewMut` of the same elements.
fn reborrow<'a>(v: &'a mut ViewMut<'_>) -> ViewMut<'a> {
    match v {
        ViewMut::F32(s) => ViewMut::F32(s),
        ViewMut::F64(s) => ViewMut::F64(s),
        ViewMut::I32(s) => ViewMut::I32(s),
        ViewMut::I64(s) => ViewMut::I64(s),
        ViewMut::Bool(s) => ViewMut::Bool(s),
        ViewMut::BF16(s) => ViewMut::BF16(s),
    }
}

/// Convolution (im2col and the packed GEMM, in the planned workspace) and max pooling, through
/// [`ingot_kernels::cpu::conv`] and [`ingot_kernels::cpu::pool`].
fn window<T: Element + k::GemmScalar + Float>(
    cx: &Cx,
    w: &WindowOp,
    o: &mut [T],
    scratch: Scratch<'_>,
) -> Result<(), ExecError> {
    use ingot_kernels::cpu::{conv, pool};
    let expected = w.infer(cx.types).map_err(|reason| invalid(cx.op, reason))?;
    // One or two operands (checked by `infer`); no heap allocation on the step's path.
    let all = [
        cx.types[0].shape.dims(),
        cx.types.get(1).map_or(&[][..], |t| t.shape.dims()),
    ];
    let dims = &all[..cx.types.len()];
    if expected != *cx.ty {
        return Err(invalid(
            cx.op,
            format!("the result is {}, the op gives {expected}", cx.ty),
        ));
    }
    let conv_err = |e: conv::ConvError| invalid(cx.op, e.to_string());
    let pool_err = |e: pool::PoolError| invalid(cx.op, e.to_string());
    if let Some(p) = w.pool_geometry(dims[0]) {
        return match w {
            WindowOp::MaxPool2d(_) => pool::max_forward(&p, cx.arg::<T>(0)?, o).map_err(pool_err),
            _ => pool::max_backward(&p, cx.arg::<T>(0)?, cx.arg::<T>(1)?, o).map_err(pool_err),
        };
    }
    let (geom, pass) = w
        .conv_geometry(dims, cx.ty.shape.dims())
        .ok_or_else(|| invalid(cx.op, "the operands do not make a convolution"))?;
    let nhwc = w.layout() == ingot_compiler::ir::ConvLayout::Nhwc;
    let need = match nhwc {
        true => ingot_kernels::cpu::conv_nhwc::workspace_len::<T>(&geom, pass),
        false => conv::workspace_len::<T>(&geom, pass),
    };
    let mut owned: Vec<T> = Vec::new();
    let ws = typed_scratch(cx.op, scratch, need, &mut owned)?;
    let (a, b) = (cx.arg::<T>(0)?, cx.arg::<T>(1)?);
    if nhwc {
        return ingot_kernels::cpu::conv_nhwc::run(&geom, pass, a, b, o, ws).map_err(conv_err);
    }
    match pass {
        conv::Pass::Forward => conv::forward(&geom, a, b, o, ws),
        conv::Pass::GradInput => conv::grad_input(&geom, a, b, o, ws),
        conv::Pass::GradWeight => conv::grad_weight(&geom, a, b, o, ws),
    }
    .map_err(conv_err)
}

fn invalid(op: &'static str, reason: impl Into<String>) -> ExecError {
    ExecError::Invalid {
        op,
        reason: reason.into(),
    }
}

/// What every op handler needs: the op's name, the operands and their types, the result type.
struct Cx<'a, 'b> {
    op: &'static str,
    inputs: &'a [View<'b>],
    types: &'a [&'a TensorType],
    ty: &'a TensorType,
}

impl<'a, 'b> Cx<'a, 'b> {
    fn arity(&self, n: usize) -> Result<(), ExecError> {
        if self.inputs.len() == n {
            Ok(())
        } else {
            Err(invalid(
                self.op,
                format!("takes {n} operand(s), got {}", self.inputs.len()),
            ))
        }
    }

    /// Checks an elementwise op: `n` operands, each with the result's shape.
    fn elementwise(&self, n: usize) -> Result<(), ExecError> {
        self.arity(n)?;
        for (i, t) in self.types.iter().enumerate() {
            if t.shape != self.ty.shape {
                return Err(invalid(
                    self.op,
                    format!(
                        "operand {i} has shape {}, the result {}",
                        t.shape, self.ty.shape
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that the result has the shape `dims`.
    fn expect_dims(&self, dims: &[usize]) -> Result<(), ExecError> {
        if self.ty.shape.dims() == dims {
            Ok(())
        } else {
            Err(invalid(
                self.op,
                format!("the result is {} but the operands give {dims:?}", self.ty),
            ))
        }
    }

    /// Operand `i`'s elements as `T`.
    fn arg<T: Element>(&self, i: usize) -> Result<&'b [T], ExecError> {
        T::of(self.inputs[i]).ok_or_else(|| {
            invalid(
                self.op,
                format!(
                    "operand {i} is {}, expected {}",
                    self.inputs[i].dtype(),
                    T::DTYPE
                ),
            )
        })
    }

    fn out<'o, T: Element>(&self, out: ViewMut<'o>) -> Result<&'o mut [T], ExecError> {
        let dt = out.dtype();
        T::of_mut(out).ok_or_else(|| {
            invalid(
                self.op,
                format!("the output is {dt}, expected {}", T::DTYPE),
            )
        })
    }
}

#[inline(always)]
fn map<A: Copy, O>(a: &[A], o: &mut [O], f: impl Fn(A) -> O) {
    for (o, &a) in o.iter_mut().zip(a) {
        *o = f(a);
    }
}

#[inline(always)]
fn map2<A: Copy, B: Copy, O>(a: &[A], b: &[B], o: &mut [O], f: impl Fn(A, B) -> O) {
    for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
        *o = f(a, b);
    }
}

fn full(value: f64, out: ViewMut<'_>) {
    match out {
        ViewMut::F32(o) => o.fill(value as f32),
        ViewMut::F64(o) => o.fill(value),
        ViewMut::I32(o) => o.fill(value as i32),
        ViewMut::I64(o) => o.fill(value as i64),
        ViewMut::Bool(o) => o.fill((value != 0.0) as u8),
        ViewMut::BF16(o) => o.fill(bf16_from_f64(value)),
    }
}

fn iota(cx: &Cx, axis: usize, out: ViewMut<'_>) -> Result<(), ExecError> {
    cx.arity(0)?;
    let dims = cx.ty.shape.dims();
    if axis >= dims.len() {
        return Err(invalid(
            cx.op,
            format!("axis {axis} out of range for {}", cx.ty.shape),
        ));
    }
    let (d, inner) = (dims[axis], k::numel(&dims[axis + 1..]));
    fn fill<T: Copy>(o: &mut [T], d: usize, inner: usize, f: impl Fn(usize) -> T) {
        if d * inner == 0 {
            return;
        }
        for block in o.chunks_exact_mut(d * inner) {
            for (j, run) in block.chunks_exact_mut(inner).enumerate() {
                run.fill(f(j));
            }
        }
    }
    match out {
        ViewMut::F32(o) => fill(o, d, inner, |j| j as f32),
        ViewMut::F64(o) => fill(o, d, inner, |j| j as f64),
        ViewMut::I32(o) => fill(o, d, inner, |j| j as i32),
        ViewMut::I64(o) => fill(o, d, inner, |j| j as i64),
        // Through f32, as the fused kernels' index (exact up to 256, then rounded).
        ViewMut::BF16(o) => fill(o, d, inner, |j| bf16::from_f32(j as f32)),
        ViewMut::Bool(_) => return Err(invalid(cx.op, "iota cannot produce bool")),
    }
    Ok(())
}

fn unary(cx: &Cx, u: UnaryOp, out: ViewMut<'_>) -> Result<(), ExecError> {
    fn float<T: Element + Float>(cx: &Cx, u: UnaryOp, o: &mut [T]) -> Result<(), ExecError> {
        let a = cx.arg::<T>(0)?;
        match u {
            UnaryOp::Neg => map(a, o, Num::neg),
            UnaryOp::Exp => map(a, o, Float::exp),
            UnaryOp::Log => map(a, o, Float::ln),
            UnaryOp::Sqrt => map(a, o, Float::sqrt),
            UnaryOp::Tanh => map(a, o, Float::tanh),
            UnaryOp::Recip => map(a, o, Float::recip),
            UnaryOp::Erf => map(a, o, Float::erf),
        }
        Ok(())
    }
    fn int<T: Element + Num>(cx: &Cx, u: UnaryOp, o: &mut [T]) -> Result<(), ExecError> {
        let a = cx.arg::<T>(0)?;
        match u {
            UnaryOp::Neg => map(a, o, Num::neg),
            _ => return Err(invalid(cx.op, format!("not defined for {}", T::DTYPE))),
        }
        Ok(())
    }
    match out {
        ViewMut::F32(o) => float(cx, u, o),
        ViewMut::F64(o) => float(cx, u, o),
        ViewMut::I32(o) => int(cx, u, o),
        ViewMut::I64(o) => int(cx, u, o),
        ViewMut::BF16(o) => {
            super::bf16::unary(u, cx.arg::<bf16>(0)?, o);
            Ok(())
        }
        ViewMut::Bool(_) => Err(invalid(cx.op, "not defined for bool")),
    }
}

fn binary(cx: &Cx, b: BinaryOp, out: ViewMut<'_>) -> Result<(), ExecError> {
    /// Every binary op but `div`, whose meaning [`Num`] gives for floats and integers alike.
    fn arith<T: Element + Num>(cx: &Cx, b: BinaryOp, o: &mut [T]) -> Result<(), ExecError> {
        let (x, y) = (cx.arg::<T>(0)?, cx.arg::<T>(1)?);
        match b {
            BinaryOp::Add => map2(x, y, o, Scalar::add),
            BinaryOp::Sub => map2(x, y, o, Num::sub),
            BinaryOp::Mul => map2(x, y, o, Num::mul),
            BinaryOp::Max => map2(x, y, o, Scalar::max),
            BinaryOp::Min => map2(x, y, o, Num::min),
            BinaryOp::Div => {
                return Err(invalid(
                    cx.op,
                    format!("div is only defined for floats, not {}", T::DTYPE),
                ))
            }
        }
        Ok(())
    }
    fn float<T: Element + Float>(cx: &Cx, b: BinaryOp, o: &mut [T]) -> Result<(), ExecError> {
        match b {
            BinaryOp::Div => map2(cx.arg::<T>(0)?, cx.arg::<T>(1)?, o, Float::div),
            _ => return arith(cx, b, o),
        }
        Ok(())
    }
    match out {
        ViewMut::F32(o) => float(cx, b, o),
        ViewMut::F64(o) => float(cx, b, o),
        ViewMut::I32(o) => arith(cx, b, o),
        ViewMut::I64(o) => arith(cx, b, o),
        ViewMut::BF16(o) => {
            super::bf16::binary(b, cx.arg::<bf16>(0)?, cx.arg::<bf16>(1)?, o);
            Ok(())
        }
        ViewMut::Bool(_) => Err(invalid(cx.op, "arithmetic is not defined for bool")),
    }
}

fn compare<T: Element + PartialOrd>(cx: &Cx, c: CmpOp, out: ViewMut<'_>) -> Result<(), ExecError> {
    let (x, y) = (cx.arg::<T>(0)?, cx.arg::<T>(1)?);
    let o = cx.out::<u8>(out)?;
    match c {
        CmpOp::Lt => map2(x, y, o, |a, b| (a < b) as u8),
        CmpOp::Le => map2(x, y, o, |a, b| (a <= b) as u8),
        CmpOp::Gt => map2(x, y, o, |a, b| (a > b) as u8),
        CmpOp::Ge => map2(x, y, o, |a, b| (a >= b) as u8),
        CmpOp::Eq => map2(x, y, o, |a, b| (a == b) as u8),
        CmpOp::Ne => map2(x, y, o, |a, b| (a != b) as u8),
    }
    Ok(())
}

fn select<T: Element>(cx: &Cx, out: ViewMut<'_>) -> Result<(), ExecError> {
    let (c, a, b) = (cx.arg::<u8>(0)?, cx.arg::<T>(1)?, cx.arg::<T>(2)?);
    let o = cx.out::<T>(out)?;
    for (((o, &c), &a), &b) in o.iter_mut().zip(c).zip(a).zip(b) {
        *o = if c != 0 { a } else { b };
    }
    Ok(())
}

fn convert(input: View<'_>, out: ViewMut<'_>) {
    macro_rules! from_num {
        ($a:expr, $zero:expr) => {
            match out {
                ViewMut::F32(o) => map($a, o, |x| x as f32),
                ViewMut::F64(o) => map($a, o, |x| x as f64),
                ViewMut::I32(o) => map($a, o, |x| x as i32),
                ViewMut::I64(o) => map($a, o, |x| x as i64),
                ViewMut::Bool(o) => map($a, o, |x| (x != $zero) as u8),
                ViewMut::BF16(o) => map($a, o, |x| bf16_from_f64(x as f64)),
            }
        };
    }
    #[allow(clippy::unnecessary_cast)]
    match input {
        View::F32(a) => from_num!(a, 0.0),
        View::F64(a) => from_num!(a, 0.0),
        View::I32(a) => from_num!(a, 0),
        View::I64(a) => from_num!(a, 0),
        View::Bool(a) => match out {
            ViewMut::F32(o) => map(a, o, |x| (x != 0) as u8 as f32),
            ViewMut::F64(o) => map(a, o, |x| (x != 0) as u8 as f64),
            ViewMut::I32(o) => map(a, o, |x| (x != 0) as i32),
            ViewMut::I64(o) => map(a, o, |x| (x != 0) as i64),
            ViewMut::Bool(o) => map(a, o, |x| (x != 0) as u8),
            ViewMut::BF16(o) => map(a, o, |x| bf16::from_f32((x != 0) as u8 as f32)),
        },
        View::BF16(a) => {
            let a = |i: usize| a[i].to_f32();
            match out {
                ViewMut::F32(o) => o.iter_mut().enumerate().for_each(|(i, o)| *o = a(i)),
                ViewMut::F64(o) => o.iter_mut().enumerate().for_each(|(i, o)| *o = a(i) as f64),
                ViewMut::I32(o) => o.iter_mut().enumerate().for_each(|(i, o)| *o = a(i) as i32),
                ViewMut::I64(o) => o.iter_mut().enumerate().for_each(|(i, o)| *o = a(i) as i64),
                ViewMut::Bool(o) => o
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, o)| *o = (a(i) != 0.0) as u8),
                ViewMut::BF16(o) => o
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, o)| *o = bf16::from_f32(a(i))),
            }
        }
    }
}

/// Copies a strided view of operand 0 (see [`k::strided_copy`]) into the output.
fn strided<T: Element>(
    cx: &Cx,
    offset: usize,
    dims: &[usize],
    strides: &[usize],
    out: ViewMut<'_>,
) -> Result<(), ExecError> {
    let a = cx.arg::<T>(0)?;
    let o = cx.out::<T>(out)?;
    if dims.len() > 64 {
        return Err(invalid(cx.op, format!("rank {} exceeds 64", dims.len())));
    }
    k::strided_copy(a, offset, dims, strides, o);
    Ok(())
}

fn concat<T: Element>(cx: &Cx, axis: usize, out: ViewMut<'_>) -> Result<(), ExecError> {
    let dims = cx.ty.shape.dims();
    if cx.inputs.is_empty() || axis >= dims.len() {
        return Err(invalid(
            cx.op,
            format!(
                "needs at least one operand and axis {axis} inside {}",
                cx.ty.shape
            ),
        ));
    }
    let mut total = 0;
    for (i, t) in cx.types.iter().enumerate() {
        let d = t.shape.dims();
        let agrees = d.len() == dims.len() && (0..d.len()).all(|x| x == axis || d[x] == dims[x]);
        if !agrees {
            return Err(invalid(
                cx.op,
                format!(
                    "operand {i} ({}) does not fit the result {} along axis {axis}",
                    t.shape, cx.ty.shape
                ),
            ));
        }
        total += d[axis];
    }
    if total != dims[axis] {
        return Err(invalid(
            cx.op,
            format!(
                "the operands give {total} along axis {axis}, the result has {}",
                dims[axis]
            ),
        ));
    }
    let o = cx.out::<T>(out)?;
    let inner = k::numel(&dims[axis + 1..]);
    let row = dims[axis] * inner;
    let mut at = 0;
    for (i, t) in cx.types.iter().enumerate() {
        let a = cx.arg::<T>(i)?;
        let chunk = t.shape.dims()[axis] * inner;
        if chunk > 0 {
            for (src, dst) in a.chunks_exact(chunk).zip(o.chunks_exact_mut(row)) {
                dst[at..at + chunk].copy_from_slice(src);
            }
        }
        at += chunk;
    }
    Ok(())
}

fn reduce<T: Element + Scalar>(
    cx: &Cx,
    kind: ReduceKind,
    axes: &[usize],
    out: ViewMut<'_>,
) -> Result<(), ExecError> {
    let src = cx.types[0].shape.dims();
    let dst = cx.ty.shape.dims();
    let mut seen = 0u64;
    let mut empty_axis = false;
    if src.len() > 64 {
        return Err(invalid(cx.op, format!("rank {} exceeds 64", src.len())));
    }
    for &a in axes {
        if a >= src.len() || a >= 64 || seen & (1 << a) != 0 {
            return Err(invalid(
                cx.op,
                format!(
                    "axes {axes:?} are out of range or repeated for {}",
                    cx.types[0].shape
                ),
            ));
        }
        seen |= 1 << a;
        empty_axis |= src[a] == 0;
    }
    let shape_ok = dst.len() == src.len()
        && (0..src.len()).all(|i| dst[i] == if seen & (1 << i) != 0 { 1 } else { src[i] });
    if !shape_ok {
        return Err(invalid(
            cx.op,
            format!(
                "reducing {} over {axes:?} does not give {}",
                cx.types[0].shape, cx.ty.shape
            ),
        ));
    }
    if kind == ReduceKind::Max && empty_axis && cx.ty.shape.numel() > 0 {
        return Err(invalid(cx.op, "max over an empty axis"));
    }
    let a = cx.arg::<T>(0)?;
    let o = cx.out::<T>(out)?;
    k::reduce(kind, a, src, axes, o);
    Ok(())
}

/// `o ← op(a)·op(b)`, or `o ← o + op(a)·op(b)` with `accumulate`, for operands 0 and 1 of `cx`.
fn matmul<T: Element + k::GemmScalar>(
    cx: &Cx,
    ta: bool,
    tb: bool,
    o: &mut [T],
    accumulate: bool,
    scratch: Scratch<'_>,
) -> Result<(), ExecError> {
    cx.arity(2)?;
    let (a, b) = (cx.types[0].shape.dims(), cx.types[1].shape.dims());
    let r = a.len();
    let mismatch = || {
        invalid(
            cx.op,
            format!(
                "cannot multiply {} by {} (transposed: {ta}, {tb})",
                cx.types[0].shape, cx.types[1].shape
            ),
        )
    };
    if r < 2 || b.len() != r || a[..r - 2] != b[..r - 2] {
        return Err(mismatch());
    }
    let ((m, kk), (kb, n)) = (matrix(a, ta), matrix(b, tb));
    if kk != kb {
        return Err(mismatch());
    }
    let mut dims: Dims = a.iter().copied().collect();
    dims[r - 2] = m;
    dims[r - 1] = n;
    cx.expect_dims(&dims)?;
    let batch = k::numel(&a[..r - 2]);
    let need = k::gemm::workspace_len::<T>(m, kk, n);
    let mut owned: Vec<T> = Vec::new();
    let ws = typed_scratch(cx.op, scratch, need, &mut owned)?;
    k::gemm::batched_matmul_ws(
        batch,
        m,
        kk,
        n,
        cx.arg::<T>(0)?,
        if ta { k::Trans::T } else { k::Trans::N },
        cx.arg::<T>(1)?,
        if tb { k::Trans::T } else { k::Trans::N },
        o,
        accumulate,
        ws,
    )
    .map_err(|e| invalid(cx.op, e.to_string()))
}

/// `out`'s elements replaced by `x`'s (one dtype, one length: checked by the caller).
fn copy_into(x: View<'_>, out: &mut ViewMut<'_>) {
    match (x, out) {
        (View::F32(x), ViewMut::F32(o)) => o.copy_from_slice(x),
        (View::F64(x), ViewMut::F64(o)) => o.copy_from_slice(x),
        (View::BF16(x), ViewMut::BF16(o)) => o.copy_from_slice(x),
        (View::I32(x), ViewMut::I32(o)) => o.copy_from_slice(x),
        (View::I64(x), ViewMut::I64(o)) => o.copy_from_slice(x),
        (View::Bool(x), ViewMut::Bool(o)) => o.copy_from_slice(x),
        _ => unreachable!("the caller checked that the dtypes agree"),
    }
}

/// The product of `matmul_acc` node `node` added into `out`, which holds the accumulator `c`:
/// `out ← out + op(a)·op(b)` for `ab = [a, b]`. The GEMM adds into an f32 or f64 `out` with
/// `beta = 1`; bf16 `a` and `b` are widened to f32 first, and a bf16 `out` is widened, summed in
/// f32 and rounded once. The planned executor calls this on a result placed over `c`; the node
/// by node path copies `c` into the result first, so both add the same f32 values in the same
/// order. The scratch is laid out as [`ingot_compiler::lower::cpu::widened::matmul_acc_bytes`]
/// says, then the f32 GEMM's packing space.
pub fn accumulate_product(
    node: &Node,
    ab: &[View<'_>],
    ab_types: &[&TensorType],
    out: ViewMut<'_>,
    scratch: Scratch<'_>,
) -> Result<(), ExecError> {
    use ingot_compiler::lower::cpu::widened::matmul_acc_bytes_of;
    let op = node.op.name();
    let Op::MatMulAcc { ta, tb } = node.op else {
        return Err(invalid(op, "not a matmul_acc"));
    };
    if ab.len() != 2 || ab_types.len() != 2 {
        return Err(invalid(op, "takes the operands a and b"));
    }
    // The product's type as the f32 GEMM sees it.
    let product_ty = TensorType::new(node.ty.shape.clone(), DType::F32);
    let needs_widening = out.dtype() == DType::BF16 || ab.iter().any(|v| v.dtype() == DType::BF16);
    if !needs_widening {
        let cx = Cx {
            op,
            inputs: ab,
            types: ab_types,
            ty: &node.ty,
        };
        return match out {
            ViewMut::F32(o) if ab_types.iter().all(|t| t.dtype == DType::F32) => {
                matmul(&cx, ta, tb, o, true, scratch)
            }
            ViewMut::F64(o) if ab_types.iter().all(|t| t.dtype == DType::F64) => {
                matmul(&cx, ta, tb, o, true, scratch)
            }
            o => Err(invalid(
                op,
                format!(
                    "{} x {} accumulated into {}",
                    ab_types[0].dtype,
                    ab_types[1].dtype,
                    o.dtype()
                ),
            )),
        };
    }
    let mut owned = Vec::new();
    let need = matmul_acc_bytes_of(&node.ty, ab_types);
    let (mut rest, given) = super::bf16::widening_scratch(op, scratch, need, &mut owned)?;
    let mut wide: SmallVec<[View<'_>; 2]> = SmallVec::new();
    for v in ab {
        match v {
            View::BF16(x) => wide.push(View::F32(super::bf16::widen_into(&mut rest, x))),
            View::F32(x) => wide.push(View::F32(x)),
            other => {
                return Err(invalid(
                    op,
                    format!("a {} operand with bf16 involved", other.dtype()),
                ))
            }
        }
    }
    let types: SmallVec<[TensorType; 2]> = ab_types
        .iter()
        .map(|t| TensorType::new(t.shape.clone(), DType::F32))
        .collect();
    let type_refs: SmallVec<[&TensorType; 2]> = types.iter().collect();
    let cx = Cx {
        op,
        inputs: &wide,
        types: &type_refs,
        ty: &product_ty,
    };
    match out {
        ViewMut::F32(o) => {
            let inner = if given {
                Scratch::Given(rest)
            } else {
                Scratch::Allocate
            };
            matmul(&cx, ta, tb, o, true, inner)
        }
        ViewMut::BF16(o) => {
            let sum = super::bf16::widen_into(&mut rest, o);
            let inner = if given {
                Scratch::Given(rest)
            } else {
                Scratch::Allocate
            };
            matmul(&cx, ta, tb, sum, true, inner)?;
            for (o, &x) in o.iter_mut().zip(sum.iter()) {
                *o = bf16::from_f32(x);
            }
            Ok(())
        }
        o => Err(invalid(
            op,
            format!("bf16 operands accumulated into {}", o.dtype()),
        )),
    }
}

/// Checks every id against `rows` before anything is written.
fn check_ids<I: Copy + Into<i64>>(
    op: &'static str,
    ids: &[I],
    rows: usize,
) -> Result<(), ExecError> {
    for (position, &id) in ids.iter().enumerate() {
        let id: i64 = id.into();
        if id < 0 || id as u64 >= rows as u64 {
            return Err(ExecError::IdOutOfRange {
                op,
                id,
                position,
                rows,
            });
        }
    }
    Ok(())
}

fn gather<T: Element>(cx: &Cx, out: ViewMut<'_>) -> Result<(), ExecError> {
    cx.arity(2)?;
    let (table, ids) = (cx.types[0].shape.dims(), cx.types[1].shape.dims());
    if table.is_empty() {
        return Err(invalid(cx.op, "the table needs at least one axis"));
    }
    let expected = ids.len() + table.len() - 1;
    let dst = cx.ty.shape.dims();
    if dst.len() != expected || dst[..ids.len()] != *ids || dst[ids.len()..] != table[1..] {
        return Err(invalid(
            cx.op,
            format!(
                "gathering rows of {} by ids {} does not give {}",
                cx.types[0].shape, cx.types[1].shape, cx.ty.shape
            ),
        ));
    }
    let rows = table[0];
    let row = k::numel(&table[1..]);
    let t = cx.arg::<T>(0)?;
    let o = cx.out::<T>(out)?;
    fn copy_rows<T: Copy, I: Copy + Into<i64>>(
        op: &'static str,
        t: &[T],
        ids: &[I],
        rows: usize,
        row: usize,
        o: &mut [T],
    ) -> Result<(), ExecError> {
        check_ids(op, ids, rows)?;
        if row == 0 {
            return Ok(());
        }
        for (&id, dst) in ids.iter().zip(o.chunks_exact_mut(row)) {
            let s = id.into() as usize * row;
            dst.copy_from_slice(&t[s..s + row]);
        }
        Ok(())
    }
    match cx.inputs[1] {
        View::I32(ids) => copy_rows(cx.op, t, ids, rows, row, o),
        View::I64(ids) => copy_rows(cx.op, t, ids, rows, row, o),
        v => Err(invalid(
            cx.op,
            format!("ids must be i32 or i64, got {}", v.dtype()),
        )),
    }
}

fn scatter_add<T: Element + Scalar>(
    cx: &Cx,
    rows: usize,
    out: ViewMut<'_>,
) -> Result<(), ExecError> {
    cx.arity(2)?;
    let (ids, vals) = (cx.types[0].shape.dims(), cx.types[1].shape.dims());
    let dst = cx.ty.shape.dims();
    let ok = !dst.is_empty()
        && dst[0] == rows
        && vals.len() == ids.len() + dst.len() - 1
        && vals[..ids.len()] == *ids
        && vals[ids.len()..] == dst[1..];
    if !ok {
        return Err(invalid(
            cx.op,
            format!(
                "adding values {} at ids {} into {rows} rows does not give {}",
                cx.types[1].shape, cx.types[0].shape, cx.ty.shape
            ),
        ));
    }
    let row = k::numel(&dst[1..]);
    let v = cx.arg::<T>(1)?;
    let o = cx.out::<T>(out)?;
    fn add_rows<T: Scalar, I: Copy + Into<i64>>(
        op: &'static str,
        ids: &[I],
        v: &[T],
        rows: usize,
        row: usize,
        o: &mut [T],
    ) -> Result<(), ExecError> {
        check_ids(op, ids, rows)?;
        o.fill(T::ZERO);
        if row == 0 {
            return Ok(());
        }
        for (&id, src) in ids.iter().zip(v.chunks_exact(row)) {
            let s = id.into() as usize * row;
            for (d, &x) in o[s..s + row].iter_mut().zip(src) {
                *d = d.add(x);
            }
        }
        Ok(())
    }
    match cx.inputs[0] {
        View::I32(ids) => add_rows(cx.op, ids, v, rows, row, o),
        View::I64(ids) => add_rows(cx.op, ids, v, rows, row, o),
        v => Err(invalid(
            cx.op,
            format!("ids must be i32 or i64, got {}", v.dtype()),
        )),
    }
}

/// The node's scratch as `need` elements of `T`: its planned workspace (checked long enough and
/// aligned for `T`), or, for a caller that has none, `owned` filled with zeros.
fn typed_scratch<'a, T: k::GemmScalar>(
    op: &'static str,
    scratch: Scratch<'a>,
    need: usize,
    owned: &'a mut Vec<T>,
) -> Result<&'a mut [T], ExecError> {
    match scratch {
        Scratch::Given(bytes) => {
            let size = std::mem::size_of::<T>();
            if bytes.len() < need * size
                || !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
            {
                return Err(invalid(
                    op,
                    format!(
                        "the workspace has {} bytes, the kernel needs {}",
                        bytes.len(),
                        need * size
                    ),
                ));
            }
            // SAFETY: the bytes are exclusively borrowed, aligned for T (checked) and long enough;
            // every bit pattern is a valid f32 or f64.
            Ok(unsafe {
                std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, bytes.len() / size)
            })
        }
        Scratch::Allocate => {
            *owned = vec![T::ZERO; need];
            Ok(owned)
        }
    }
}
