//! Unit tests of the rewrite pass: each rule fires and keeps values, type conflicts are errors,
//! results are deterministic, extraction survives cycles, and limits stop the run cleanly.
//!
//! Values are checked with a small f64 evaluator ([`eval`]): the runtime's interpreter lives in a
//! crate that depends on this one (ir-tests/tests/rewrite.rs checks whole steps with it).

use super::analysis::{Data, EGraph, Facts};
use super::lang::{ENode, Kind, Ty};
use super::rules::{self, Recipe, Rule};
use super::*;
use crate::ir::{
    text, Axes, BinaryOp, CmpOp, DType, Graph, Init, LeafKind, NodeId, Op, ReduceOp, Shape,
    TensorType, UnaryOp,
};
use crate::{autodiff, models};
use std::collections::BTreeMap;

// ---------------------------------------------------------------------------------------------
// A reference evaluator in f64
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
struct T {
    dims: Vec<usize>,
    v: Vec<f64>,
}

fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        idx[a] = i % dims[a];
        i /= dims[a];
    }
    idx
}

fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(strides(dims)).map(|(i, s)| i * s).sum()
}

/// A deterministic pseudo-random value in [-1, 1) for element `i` of leaf `name`.
fn noise(name: &str, i: usize) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain(i.to_le_bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 29;
    (h % 2000) as f64 / 1000.0 - 1.0
}

fn leaf_value(name: &str, ty: &TensorType) -> T {
    let n = ty.shape.numel();
    let v = (0..n)
        .map(|i| {
            let x = noise(name, i);
            match ty.dtype {
                DType::F32 | DType::F64 => x,
                DType::BF16 => ingot_kernels::dtype::bf16_from_f64(x).to_f64(),
                DType::I32 | DType::I64 => ((x + 1.0) * 2.0).floor(), // ids 0..4
                DType::Bool => (x > 0.0) as u8 as f64,
            }
        })
        .collect();
    T {
        dims: ty.shape.dims().to_vec(),
        v,
    }
}

/// Every node's value (leaves from [`leaf_value`]), in f64 with the IR's meaning.
fn eval(g: &Graph) -> Vec<T> {
    let mut vals: Vec<T> = Vec::with_capacity(g.len());
    for id in g.ids() {
        let n = g.node(id);
        let dims = n.ty.shape.dims().to_vec();
        let numel = n.ty.shape.numel();
        let arg = |i: usize| &vals[n.inputs[i].index()];
        let map = |f: &dyn Fn(&[f64]) -> f64| -> Vec<f64> {
            (0..numel)
                .map(|e| {
                    let xs: Vec<f64> = (0..n.inputs.len()).map(|i| arg(i).v[e]).collect();
                    f(&xs)
                })
                .collect()
        };
        let gather_from = |src: &T, f: &dyn Fn(&[usize]) -> usize| -> Vec<f64> {
            (0..numel).map(|e| src.v[f(&unravel(e, &dims))]).collect()
        };
        let v: Vec<f64> = match &n.op {
            Op::Leaf { name, .. } => leaf_value(name, &n.ty).v,
            Op::Full { value } => vec![
                if n.ty.dtype == DType::Bool {
                    (*value != 0.0) as u8 as f64
                } else {
                    *value
                };
                numel
            ],
            Op::Iota { axis } => (0..numel)
                .map(|e| unravel(e, &dims)[*axis] as f64)
                .collect(),
            Op::Unary(u) => map(&|x| match u {
                UnaryOp::Neg => -x[0],
                UnaryOp::Exp => x[0].exp(),
                UnaryOp::Log => x[0].ln(),
                UnaryOp::Sqrt => x[0].sqrt(),
                UnaryOp::Tanh => x[0].tanh(),
                UnaryOp::Recip => 1.0 / x[0],
                UnaryOp::Erf => ingot_kernels::cpu::Float::erf(x[0]),
            }),
            Op::Binary(b) => map(&|x| match b {
                BinaryOp::Add => x[0] + x[1],
                BinaryOp::Sub => x[0] - x[1],
                BinaryOp::Mul => x[0] * x[1],
                BinaryOp::Div => x[0] / x[1],
                BinaryOp::Max | BinaryOp::Min if x[0].is_nan() || x[1].is_nan() => f64::NAN,
                BinaryOp::Max => x[0].max(x[1]),
                BinaryOp::Min => x[0].min(x[1]),
            }),
            Op::Compare(c) => map(&|x| analysis::compare(*c, x[0], x[1])),
            Op::Select => map(&|x| if x[0] != 0.0 { x[1] } else { x[2] }),
            Op::Convert => map(&|x| match n.ty.dtype {
                DType::Bool => (x[0] != 0.0) as u8 as f64,
                DType::I32 | DType::I64 => x[0].trunc(),
                DType::BF16 => ingot_kernels::dtype::bf16_from_f64(x[0]).to_f64(),
                _ => x[0],
            }),
            Op::StopGradient | Op::Reshape => arg(0).v.clone(),
            Op::Broadcast => {
                let src = arg(0);
                let off = dims.len() - src.dims.len();
                gather_from(src, &|idx| {
                    let i: Vec<usize> = (0..src.dims.len())
                        .map(|a| if src.dims[a] == 1 { 0 } else { idx[a + off] })
                        .collect();
                    ravel(&i, &src.dims)
                })
            }
            Op::Transpose { perm } => {
                let src = arg(0);
                gather_from(src, &|idx| {
                    let mut i = vec![0; idx.len()];
                    for (o, &p) in perm.iter().enumerate() {
                        i[p] = idx[o];
                    }
                    ravel(&i, &src.dims)
                })
            }
            Op::Slice { axis, start, .. } => {
                let src = arg(0);
                gather_from(src, &|idx| {
                    let mut i = idx.to_vec();
                    i[*axis] += start;
                    ravel(&i, &src.dims)
                })
            }
            Op::Concat { axis } => (0..numel)
                .map(|e| {
                    let mut idx = unravel(e, &dims);
                    let mut k = 0;
                    while idx[*axis] >= arg(k).dims[*axis] {
                        idx[*axis] -= arg(k).dims[*axis];
                        k += 1;
                    }
                    arg(k).v[ravel(&idx, &arg(k).dims)]
                })
                .collect(),
            Op::Reduce { op, axes } => {
                let src = arg(0);
                let mut out = vec![
                    match op {
                        ReduceOp::Sum => 0.0,
                        ReduceOp::Max => f64::NEG_INFINITY,
                    };
                    numel
                ];
                for (e, &x) in src.v.iter().enumerate() {
                    let mut idx = unravel(e, &src.dims);
                    for &a in axes {
                        idx[a] = 0;
                    }
                    let o = &mut out[ravel(&idx, &dims)];
                    *o = match op {
                        ReduceOp::Sum => *o + x,
                        ReduceOp::Max if o.is_nan() || x.is_nan() => f64::NAN,
                        ReduceOp::Max => o.max(x),
                    };
                }
                out
            }
            Op::MatMul { ta, tb } => {
                let (a, b) = (arg(0), arg(1));
                let r = dims.len();
                let k = if *ta { a.dims[r - 2] } else { a.dims[r - 1] };
                (0..numel)
                    .map(|e| {
                        let idx = unravel(e, &dims);
                        (0..k)
                            .map(|j| {
                                let mut ia = idx.clone();
                                let (x, y) = if *ta {
                                    (j, idx[r - 2])
                                } else {
                                    (idx[r - 2], j)
                                };
                                ia[r - 2] = x;
                                ia[r - 1] = y;
                                let mut ib = idx.clone();
                                let (x, y) = if *tb {
                                    (idx[r - 1], j)
                                } else {
                                    (j, idx[r - 1])
                                };
                                ib[r - 2] = x;
                                ib[r - 1] = y;
                                a.v[ravel(&ia, &a.dims)] * b.v[ravel(&ib, &b.dims)]
                            })
                            .sum()
                    })
                    .collect()
            }
            Op::Window(w) => panic!("the test interpreter has no {}", w.name()),
            Op::Gather => {
                let (table, ids) = (arg(0), arg(1));
                let row: usize = table.dims[1..].iter().product();
                (0..numel)
                    .map(|e| table.v[ids.v[e / row.max(1)] as usize * row + e % row.max(1)])
                    .collect()
            }
            Op::ScatterAdd { .. } => {
                let (ids, values) = (arg(0), arg(1));
                let row: usize = dims[1..].iter().product();
                let mut out = vec![0.0; numel];
                for (e, &x) in values.v.iter().enumerate() {
                    out[ids.v[e / row.max(1)] as usize * row + e % row.max(1)] += x;
                }
                out
            }
            Op::Dropout { p, salt } => {
                let key = ingot_kernels::rng::key(arg(1).v[0] as i64 as u64, *salt);
                let s = ingot_kernels::rng::keep_scale(*p);
                (0..numel)
                    .map(|e| {
                        let keep = ingot_kernels::rng::keeps(key, e as u64, *p as f32);
                        arg(0).v[e] * if keep { s } else { 0.0 }
                    })
                    .collect()
            }
            Op::Fused(_)
            | Op::Result { .. }
            | Op::Attention { .. }
            | Op::AttentionGrad { .. }
            | Op::MatMulAcc { .. }
            | Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. } => {
                unreachable!("not in these tests")
            }
        };
        vals.push(T { dims, v });
    }
    vals
}

/// The outputs' and updates' values, by name (updates by their target leaf's name).
fn results(g: &Graph) -> BTreeMap<String, T> {
    let vals = eval(g);
    let mut out = BTreeMap::new();
    for (name, id) in &g.outputs {
        out.insert(format!("output {name}"), vals[id.index()].clone());
    }
    for u in &g.updates {
        let name = g.leaf_name(u.target).unwrap();
        out.insert(format!("update {name}"), vals[u.value.index()].clone());
    }
    out
}

fn assert_close(a: &BTreeMap<String, T>, b: &BTreeMap<String, T>, rel: f64) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (k, x) in a {
        let y = &b[k];
        assert_eq!(x.dims, y.dims, "{k}");
        for (i, (p, q)) in x.v.iter().zip(&y.v).enumerate() {
            let ok =
                (p.is_nan() && q.is_nan()) || (p - q).abs() <= rel * (1.0 + p.abs().max(q.abs()));
            assert!(ok, "{k}[{i}]: {p} vs {q}");
        }
    }
}

/// Simplifies `g`, checks the result's contract (verifies, same interface, same values), and
/// returns it with the report.
fn check(g: &Graph) -> (Graph, RewriteReport) {
    let (s, r) = simplify(g, &RewriteOptions::default()).unwrap_or_else(|e| panic!("{e}\n{g}"));
    s.verify().unwrap();
    assert_same_interface(g, &s);
    assert_close(&results(g), &results(&s), 1e-6);
    (s, r)
}

fn assert_same_interface(g: &Graph, s: &Graph) {
    let leaves = |g: &Graph| -> Vec<(Op, TensorType)> {
        g.nodes()
            .iter()
            .filter(|n| n.op.is_leaf())
            .map(|n| (n.op.clone(), n.ty.clone()))
            .collect()
    };
    assert_eq!(leaves(g), leaves(s));
    assert_eq!(
        g.outputs.keys().collect::<Vec<_>>(),
        s.outputs.keys().collect::<Vec<_>>()
    );
    let targets = |g: &Graph| -> Vec<String> {
        g.updates
            .iter()
            .map(|u| g.leaf_name(u.target).unwrap().to_string())
            .collect()
    };
    assert_eq!(targets(g), targets(s));
}

fn fired(r: &RewriteReport, rule: &str) -> usize {
    r.rules_applied
        .iter()
        .find(|(n, _)| n == rule)
        .unwrap_or_else(|| panic!("no rule {rule}"))
        .1
}

fn count(g: &Graph, op: &str) -> usize {
    g.nodes().iter().filter(|n| n.op.name() == op).count()
}

fn f32s(dims: &[usize]) -> TensorType {
    TensorType::new(Shape::new(dims), DType::F32)
}

/// A graph with one f32 parameter `x` of shape `dims`.
fn with_x(dims: &[usize]) -> (Graph, NodeId) {
    let mut g = Graph::new();
    let x = g
        .parameter("x", dims, DType::F32, Init::Normal { std: 1.0 })
        .unwrap();
    (g, x)
}

// ---------------------------------------------------------------------------------------------
// Identities
// ---------------------------------------------------------------------------------------------

#[test]
fn stop_gradient_is_removed() {
    let (mut g, x) = with_x(&[3]);
    let s = g.stop_gradient(x).unwrap();
    let e = g.exp(s).unwrap();
    g.set_output("y", e).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "stop-gradient"), 1);
    assert_eq!(count(&s, "stop_gradient"), 0);
    assert_eq!(s.len(), 2);
}

#[test]
fn multiplying_by_one_and_dividing_by_one_are_removed_on_either_side() {
    let (mut g, x) = with_x(&[2, 3]);
    let a = g.mul_scalar(x, 1.0).unwrap(); // x * 1
    let one = g.full(1.0, [2, 3], DType::F32).unwrap();
    let b = g.mul(one, a).unwrap(); // 1 * (x * 1)
    let c = g.div(b, one).unwrap(); // / 1
    let e = g.exp(c).unwrap();
    g.set_output("y", e).unwrap();
    let (s, r) = check(&g);
    assert!(fired(&r, "mul-one") >= 2);
    assert_eq!(fired(&r, "div-one"), 1);
    assert_eq!(s.len(), 2, "{s}");
}

#[test]
fn adding_and_subtracting_zero_are_removed() {
    let (mut g, x) = with_x(&[4]);
    let a = g.add_scalar(x, 0.0).unwrap(); // x + 0
    let zero = g.full(0.0, [], DType::F32).unwrap();
    let b = g.add(zero, a).unwrap(); // broadcast(0) + ..
    let c = g.sub(b, zero).unwrap(); // .. - broadcast(0)
    let e = g.exp(c).unwrap();
    g.set_output("y", e).unwrap();
    let (s, r) = check(&g);
    assert!(fired(&r, "add-zero") >= 2);
    assert_eq!(fired(&r, "sub-zero"), 1);
    assert_eq!(s.len(), 2, "{s}");
}

#[test]
fn multiplying_a_variable_by_zero_is_not_folded() {
    // x * 0 is NaN for an infinite or NaN x: only constants fold.
    let (mut g, x) = with_x(&[4]);
    let z = g.mul_scalar(x, 0.0).unwrap();
    g.set_output("y", z).unwrap();
    let (s, _) = check(&g);
    assert_eq!(count(&s, "mul"), 1);
}

#[test]
fn double_negation_and_equal_branches_are_removed() {
    let (mut g, x) = with_x(&[3]);
    let n = g.neg(x).unwrap();
    let nn = g.neg(n).unwrap();
    let zero = g.full(0.0, [3], DType::F32).unwrap();
    let c = g.compare(CmpOp::Gt, x, zero).unwrap();
    let sel = g.select(c, nn, x).unwrap(); // both branches are x
    let m = g.maximum(sel, sel).unwrap();
    let e = g.exp(m).unwrap();
    g.set_output("y", e).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "neg-neg"), 1);
    assert_eq!(fired(&r, "select-same"), 1);
    assert_eq!(fired(&r, "max-min-same"), 1);
    assert_eq!(s.len(), 2, "{s}");
}

#[test]
fn a_select_on_a_constant_condition_picks_its_branch() {
    let (mut g, x) = with_x(&[3]);
    let t = g.full(1.0, [3], DType::Bool).unwrap();
    let y = g.exp(x).unwrap();
    let a = g.select(t, x, y).unwrap();
    let f = g.full(0.0, [3], DType::Bool).unwrap();
    let b = g.select(f, x, y).unwrap();
    g.set_output("a", a).unwrap();
    g.set_output("b", b).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "select-const"), 2);
    assert_eq!(count(&s, "select"), 0);
    assert_eq!(s.outputs["a"], s.leaf("x").unwrap());
}

#[test]
fn conversions_broadcasts_reshapes_and_transposes_to_the_same_type_are_removed() {
    let (mut g, x) = with_x(&[2, 3]);
    let t = f32s(&[2, 3]);
    let a = g.push(Op::Convert, &[x], Some(t.clone())).unwrap();
    let b = g.push(Op::Broadcast, &[a], Some(t.clone())).unwrap();
    let c = g.push(Op::Reshape, &[b], Some(t)).unwrap();
    let perm = Axes::from_slice(&[0, 1]);
    let d = g.push(Op::Transpose { perm }, &[c], None).unwrap();
    let e = g.exp(d).unwrap();
    g.set_output("y", e).unwrap();
    let (s, r) = check(&g);
    for rule in [
        "convert-same",
        "broadcast-same",
        "reshape-same",
        "transpose-identity",
    ] {
        assert_eq!(fired(&r, rule), 1, "{rule}");
    }
    assert_eq!(s.len(), 2, "{s}");
}

#[test]
fn a_reduction_over_size_one_axes_is_removed() {
    let (mut g, x) = with_x(&[2, 1, 3]);
    let a = g.sum(x, &[1]).unwrap();
    let b = g.max(a, &[1]).unwrap();
    let e = g.exp(b).unwrap();
    g.set_output("y", e).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "reduce-unit-axes"), 2);
    assert_eq!(s.len(), 2, "{s}");
}

// ---------------------------------------------------------------------------------------------
// Chains
// ---------------------------------------------------------------------------------------------

#[test]
fn two_transposes_become_one_or_none() {
    let (mut g, x) = with_x(&[2, 3, 4]);
    let a = g.transpose(x, &[1, 2, 0]).unwrap(); // [3,4,2]
    let b = g.transpose(a, &[2, 0, 1]).unwrap(); // back to [2,3,4]
    let c = g.transpose(a, &[1, 0, 2]).unwrap(); // [4,3,2] = x transposed by [2,1,0]
    g.set_output("b", b).unwrap();
    g.set_output("c", c).unwrap();
    let (s, r) = check(&g);
    assert!(fired(&r, "transpose-transpose") >= 2);
    assert_eq!(s.outputs["b"], s.leaf("x").unwrap());
    let c = s.node(s.outputs["c"]);
    assert_eq!(
        c.op,
        Op::Transpose {
            perm: Axes::from_slice(&[2, 1, 0])
        }
    );
    assert_eq!(c.inputs[0], s.leaf("x").unwrap());
    assert_eq!(s.len(), 2);
}

#[test]
fn chained_reshapes_and_broadcasts_collapse() {
    let (mut g, x) = with_x(&[6]);
    let a = g.reshape(x, [2, 3]).unwrap();
    let b = g.reshape(a, [3, 2]).unwrap();
    let c = g.reshape(b, [6]).unwrap(); // back to x
    let d = g.broadcast_to(x, [1, 6]).unwrap();
    let e = g.broadcast_to(d, [4, 6]).unwrap();
    g.set_output("b", b).unwrap();
    g.set_output("c", c).unwrap();
    g.set_output("e", e).unwrap();
    let (s, r) = check(&g);
    assert!(fired(&r, "reshape-reshape") >= 2);
    assert_eq!(fired(&r, "broadcast-broadcast"), 1);
    let x = s.leaf("x").unwrap();
    assert_eq!(s.outputs["c"], x);
    assert_eq!(s.node(s.outputs["b"]).inputs[0], x);
    assert_eq!(s.node(s.outputs["e"]).inputs[0], x);
    assert_eq!(s.len(), 3, "{s}");
}

// ---------------------------------------------------------------------------------------------
// Reductions of broadcasts
// ---------------------------------------------------------------------------------------------

#[test]
fn summing_a_broadcast_over_its_expanded_axes_multiplies_by_the_count() {
    // Same rank: [3,1] -> [3,5], summed over axis 1, is x * 5.
    let (mut g, x) = with_x(&[3, 1]);
    let b = g.broadcast_to(x, [3, 5]).unwrap();
    let s1 = g.sum(b, &[1]).unwrap();
    g.set_output("same_rank", s1).unwrap();
    // Rank-expanding: [3] -> [4,2,3], summed over axes 0 and 1, is reshape(x) * 8.
    let y = g.parameter("y", [3], DType::F32, Init::Zeros).unwrap();
    let b = g.broadcast_to(y, [4, 2, 3]).unwrap();
    let s2 = g.sum(b, &[0, 1]).unwrap();
    g.set_output("expanding", s2).unwrap();
    // Over part of the expanded axes: [3] -> [4,2,3] summed over axis 0 is broadcast(y) * 4.
    let s3 = g.sum(b, &[0]).unwrap();
    g.set_output("partial", s3).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "reduce-of-broadcast"), 3);
    assert_eq!(count(&s, "reduce_sum"), 0, "{s}");
    let k = s.node(s.outputs["same_rank"]);
    assert_eq!(k.op, Op::Binary(BinaryOp::Mul));
    assert_eq!(k.inputs[0], s.leaf("x").unwrap());
    assert_eq!(s.node(k.inputs[1]).op, Op::Full { value: 5.0 });
    let k = s.node(s.outputs["expanding"]);
    assert_eq!(s.node(k.inputs[0]).op, Op::Reshape);
    assert_eq!(s.node(k.inputs[1]).op, Op::Full { value: 8.0 });
}

#[test]
fn the_max_of_a_broadcast_over_its_expanded_axes_is_the_operand() {
    let (mut g, x) = with_x(&[3, 1]);
    let b = g.broadcast_to(x, [3, 5]).unwrap();
    let m = g.max(b, &[1]).unwrap();
    g.set_output("y", m).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "reduce-of-broadcast"), 1);
    assert_eq!(s.outputs["y"], s.leaf("x").unwrap());
}

#[test]
fn a_reduction_over_an_axis_the_broadcast_did_not_expand_is_kept() {
    let (mut g, x) = with_x(&[3, 1]);
    let b = g.broadcast_to(x, [3, 5]).unwrap();
    let m = g.sum(b, &[0, 1]).unwrap();
    g.set_output("y", m).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "reduce-of-broadcast"), 0);
    assert_eq!(count(&s, "reduce_sum"), 1);
}

// ---------------------------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------------------------

fn full_value(g: &Graph, id: NodeId) -> f64 {
    match g.node(id).op {
        Op::Full { value } => value,
        ref op => panic!("{id} is a {}, not a full\n{g}", op.name()),
    }
}

#[test]
fn constant_expressions_fold_into_one_full_with_the_runtimes_rounding() {
    let mut g = Graph::new();
    let a = g.full(0.1, [2, 3], DType::F32).unwrap();
    let b = g.full(3.0, [], DType::F32).unwrap();
    let c = g.mul(a, b).unwrap(); // broadcast, mul in f32
    let t = g.transpose(c, &[1, 0]).unwrap();
    let r = g.reshape(t, [6]).unwrap();
    let sl = g.slice(r, 0, 1, 4).unwrap();
    let e = g.exp(sl).unwrap();
    let sum = g.sum(e, &[0]).unwrap(); // 3 * exp(0.3f32)
    g.set_output("sum", sum).unwrap();
    let (s, rep) = check(&g);
    assert!(fired(&rep, "constant-fold") >= 1);
    assert_eq!(s.len(), 1, "{s}");
    let want = (ingot_kernels::cpu::Float::exp(0.1f32 * 3.0f32) as f64 * 3.0) as f32 as f64;
    assert_eq!(full_value(&s, s.outputs["sum"]), want);
}

#[test]
fn integer_constants_wrap_and_compare_convert_and_select_fold() {
    let mut g = Graph::new();
    let big = g.full(2147483647.0, [2], DType::I32).unwrap();
    let one = g.full(1.0, [2], DType::I32).unwrap();
    let wrapped = g.add(big, one).unwrap(); // i32::MIN
    g.set_output("wrapped", wrapped).unwrap();
    let lt = g.compare(CmpOp::Lt, wrapped, one).unwrap(); // true
    let f = g.convert(lt, DType::F32).unwrap(); // 1.0
    let x = g.full(-2.5, [2], DType::F32).unwrap();
    let i = g.convert(x, DType::I64).unwrap(); // -2 (truncation)
    g.set_output("truncated", i).unwrap();
    let y = g.full(7.0, [2], DType::F32).unwrap();
    let sel = g.select(lt, f, y).unwrap(); // 1.0
    g.set_output("selected", sel).unwrap();
    let (s, _) = simplify(&g, &RewriteOptions::default()).unwrap();
    s.verify().unwrap();
    assert_eq!(full_value(&s, s.outputs["wrapped"]), i32::MIN as f64);
    assert_eq!(full_value(&s, s.outputs["truncated"]), -2.0);
    assert_eq!(full_value(&s, s.outputs["selected"]), 1.0);
    assert_eq!(s.len(), 3, "{s}");
}

#[test]
fn folded_reductions_follow_the_kernels() {
    let mut g = Graph::new();
    let a = g.full(0.5, [4, 3], DType::F32).unwrap();
    let s = g.sum(a, &[0, 1]).unwrap(); // 6
    let m = g.max(a, &[1]).unwrap(); // 0.5
    let n = g.full(f64::NAN, [2], DType::F32).unwrap();
    let mn = g.max(n, &[0]).unwrap(); // NaN propagates through max: NaN
    g.set_output("sum", s).unwrap();
    g.set_output("max", m).unwrap();
    g.set_output("max_nan", mn).unwrap();
    let (out, _) = simplify(&g, &RewriteOptions::default()).unwrap();
    assert_eq!(full_value(&out, out.outputs["sum"]), 6.0);
    assert_eq!(full_value(&out, out.outputs["max"]), 0.5);
    assert!(full_value(&out, out.outputs["max_nan"]).is_nan());
}

#[test]
fn folding_max_and_min_of_a_nan_constant_gives_nan() {
    let mut g = Graph::new();
    let n = g.full(f64::NAN, [2], DType::F32).unwrap();
    let z = g.full(0.0, [2], DType::F32).unwrap();
    let mx = g.binary(BinaryOp::Max, n, z).unwrap();
    let mn = g.binary(BinaryOp::Min, z, n).unwrap();
    g.set_output("max", mx).unwrap();
    g.set_output("min", mn).unwrap();
    let (out, _) = simplify(&g, &RewriteOptions::default()).unwrap();
    assert!(full_value(&out, out.outputs["max"]).is_nan());
    assert!(full_value(&out, out.outputs["min"]).is_nan());
}

#[test]
fn constant_factors_of_a_product_multiply_together() {
    let (mut g, x) = with_x(&[2, 3]);
    let a = g.mul_scalar(x, 0.5).unwrap();
    let c = g.full(4.0, [3], DType::F32).unwrap(); // broadcast constant
    let b = g.mul(c, a).unwrap();
    let e = g.exp(b).unwrap();
    g.set_output("y", e).unwrap();
    let (s, r) = check(&g);
    assert!(fired(&r, "mul-constants") >= 1);
    assert_eq!(count(&s, "mul"), 1, "{s}");
    let m = s.node(s.node(s.outputs["y"]).inputs[0]);
    assert_eq!(m.inputs[0], s.leaf("x").unwrap());
    assert_eq!(full_value(&s, m.inputs[1]), 2.0);
}

#[test]
fn constant_factors_of_a_product_with_zero_do_not_grow_without_end() {
    // (x * 2) * 0 is x * 0, and so is c * (x * 0) for any constant c: the class holds
    // c * itself, and a naive (x * c1) * c2 rule would derive x * c^n for every n.
    let (mut g, x) = with_x(&[2, 3]);
    let a = g.mul_scalar(x, 2.0).unwrap();
    let z = g.mul_scalar(a, 0.0).unwrap();
    let t = g.full(0.75, [2, 3], DType::F32).unwrap();
    let d = g.mul(t, z).unwrap();
    let e = g.mul_scalar(d, 3.0).unwrap();
    g.set_output("y", e).unwrap();
    let (_, r) = check(&g);
    assert_eq!(r.stop_reason, "saturated");
    assert!(r.egraph_nodes < 30, "{r}");
}

#[test]
fn equal_constants_share_one_node() {
    let (mut g, x) = with_x(&[2, 3]);
    let z = g.full(0.0, [], DType::F32).unwrap();
    let a = g.broadcast_to(z, [2, 3]).unwrap();
    let b = g.full(0.0, [2, 3], DType::F32).unwrap();
    let p = g.maximum(x, a).unwrap();
    let q = g.minimum(x, b).unwrap();
    let y = g.add(p, q).unwrap();
    g.set_output("y", y).unwrap();
    let (s, _) = check(&g);
    assert_eq!(count(&s, "full"), 1, "{s}");
    assert_eq!(count(&s, "broadcast"), 0, "{s}");
}

// ---------------------------------------------------------------------------------------------
// Matrix products
// ---------------------------------------------------------------------------------------------

#[test]
fn a_transposed_matmul_operand_is_read_in_place() {
    let mut g = Graph::new();
    let w = g.parameter("w", [5, 4], DType::F32, Init::Zeros).unwrap();
    let x = g.input("x", [2, 3, 4], DType::F32).unwrap();
    let v = g
        .parameter("v", [2, 3, 6], DType::F32, Init::Zeros)
        .unwrap();
    let wt = g.transpose_last(w).unwrap(); // [4,5]
    let w3 = g.broadcast_to(wt, [2, 4, 5]).unwrap();
    let y = g.matmul(x, w3).unwrap(); // [2,3,5]
    let xt = g.transpose_last(x).unwrap(); // [2,4,3]
    let z = g.matmul(xt, v).unwrap(); // [2,4,6]
    g.set_output("y", y).unwrap();
    g.set_output("z", z).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "matmul-transposed-operand"), 1);
    let z = s.node(s.outputs["z"]);
    assert_eq!(
        z.op,
        Op::MatMul {
            ta: true,
            tb: false
        }
    );
    assert_eq!(z.inputs[0], s.leaf("x").unwrap());
}

#[test]
fn a_transposed_matmul_becomes_the_swapped_product_and_weights_are_not_transposed() {
    // The linear layer's pattern: y = x wᵀ in the forward pass, dW = (xᵀ g)ᵀ in the backward.
    let mut g = Graph::new();
    let w = g.parameter("w", [5, 4], DType::F32, Init::Zeros).unwrap();
    let x = g.input("x", [3, 4], DType::F32).unwrap();
    let gy = g.input("g", [3, 5], DType::F32).unwrap();
    let wt = g.transpose_last(w).unwrap();
    let y = g.matmul(x, wt).unwrap();
    let dx = g.matmul_t(gy, wt, false, true).unwrap();
    let dwt = g.matmul_t(x, gy, true, false).unwrap(); // [4,5]
    let dw = g.transpose_last(dwt).unwrap(); // [5,4]
    g.set_output("y", y).unwrap();
    g.set_output("dx", dx).unwrap();
    g.set_output("dw", dw).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "matmul-transposed-operand"), 2);
    assert_eq!(fired(&r, "transpose-of-matmul"), 1);
    assert_eq!(count(&s, "transpose"), 0, "{s}");
    let (w, x, gy) = (
        s.leaf("w").unwrap(),
        s.leaf("x").unwrap(),
        s.leaf("g").unwrap(),
    );
    let node = |name: &str| s.node(s.outputs[name]).clone();
    assert_eq!(
        node("y").op,
        Op::MatMul {
            ta: false,
            tb: true
        }
    );
    assert_eq!(node("y").inputs.as_slice(), &[x, w]);
    assert_eq!(
        node("dx").op,
        Op::MatMul {
            ta: false,
            tb: false
        }
    );
    assert_eq!(node("dx").inputs.as_slice(), &[gy, w]);
    assert_eq!(
        node("dw").op,
        Op::MatMul {
            ta: true,
            tb: false
        }
    );
    assert_eq!(node("dw").inputs.as_slice(), &[gy, x]);
}

// ---------------------------------------------------------------------------------------------
// Negations, concatenations, slices
// ---------------------------------------------------------------------------------------------

#[test]
fn negations_move_out_of_sums_and_into_subtractions() {
    let (mut g, x) = with_x(&[3, 4]);
    let y = g.parameter("y", [3, 4], DType::F32, Init::Zeros).unwrap();
    let n = g.neg(x).unwrap();
    let s = g.sum(n, &[1]).unwrap();
    g.set_output("sum", s).unwrap();
    let ny = g.neg(y).unwrap();
    let a = g.add(x, ny).unwrap(); // x - y
    let b = g.sub(a, ny).unwrap(); // (x - y) + y
    let e = g.exp(b).unwrap();
    g.set_output("e", e).unwrap();
    let (out, r) = check(&g);
    assert_eq!(fired(&r, "sum-of-neg"), 1);
    assert_eq!(fired(&r, "add-neg"), 1);
    assert_eq!(fired(&r, "sub-neg"), 1);
    let sum = out.node(out.outputs["sum"]);
    assert_eq!(sum.op, Op::Unary(UnaryOp::Neg));
    assert_eq!(out.node(sum.inputs[0]).shape().dims(), &[3, 1]);
    assert_eq!(count(&out, "neg"), 1, "{out}");
}

#[test]
fn zero_padded_slice_gradients_add_up_to_one_concatenation() {
    // What autodiff gives for the gradient of three slices of one tensor.
    let mut g = Graph::new();
    let a = g.input("a", [2, 3], DType::F32).unwrap();
    let b = g.input("b", [2, 3], DType::F32).unwrap();
    let c = g.input("c", [2, 3], DType::F32).unwrap();
    let z3 = g.full(0.0, [2, 3], DType::F32).unwrap();
    let z6 = g.full(0.0, [2, 6], DType::F32).unwrap();
    let pa = g.concat(&[a, z6], 1).unwrap();
    let pb = g.concat(&[z3, b, z3], 1).unwrap();
    let pc = g.concat(&[z6, c], 1).unwrap();
    let s = g.add(pa, pb).unwrap();
    let s = g.add(s, pc).unwrap();
    g.set_output("grad", s).unwrap();
    let (out, r) = check(&g);
    assert!(fired(&r, "add-of-padded-concats") >= 2);
    let n = out.node(out.outputs["grad"]);
    assert_eq!(n.op, Op::Concat { axis: 1 });
    let ids =
        |names: &[&str]| -> Vec<NodeId> { names.iter().map(|n| out.leaf(n).unwrap()).collect() };
    assert_eq!(n.inputs.to_vec(), ids(&["a", "b", "c"]));
    assert_eq!(count(&out, "add"), 0, "{out}");
}

#[test]
fn a_slice_of_a_concatenation_reads_the_part() {
    let mut g = Graph::new();
    let a = g.input("a", [2, 3], DType::F32).unwrap();
    let b = g.input("b", [2, 4], DType::F32).unwrap();
    let c = g.concat(&[a, b], 1).unwrap();
    let whole = g.slice(c, 1, 3, 7).unwrap();
    let part = g.slice(c, 1, 4, 6).unwrap();
    g.set_output("whole", whole).unwrap();
    g.set_output("part", part).unwrap();
    let (s, r) = check(&g);
    assert_eq!(fired(&r, "slice-of-concat"), 2);
    assert_eq!(count(&s, "concat"), 0);
    assert_eq!(s.outputs["whole"], s.leaf("b").unwrap());
    let p = s.node(s.outputs["part"]);
    assert_eq!(
        p.op,
        Op::Slice {
            axis: 1,
            start: 1,
            end: 3
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Sharing, leaves, order
// ---------------------------------------------------------------------------------------------

#[test]
fn identical_subexpressions_become_one_node() {
    let (mut g, x) = with_x(&[3]);
    let a = g.exp(x).unwrap();
    let b = g.exp(x).unwrap();
    let y = g.mul(a, b).unwrap();
    g.set_output("y", y).unwrap();
    let (s, _) = check(&g);
    assert_eq!(count(&s, "exp"), 1, "{s}");
    let y = s.node(s.outputs["y"]);
    assert_eq!(y.inputs[0], y.inputs[1]);
}

#[test]
fn leaves_of_one_type_stay_distinct_and_unused_leaves_stay_in_order() {
    let mut g = Graph::new();
    let a = g.parameter("a", [3], DType::F32, Init::Zeros).unwrap();
    let _unused = g.input("unused", [3], DType::F32).unwrap();
    let b = g.parameter("b", [3], DType::F32, Init::Zeros).unwrap();
    let s = g.add(a, b).unwrap();
    let t = g.add_scalar(b, 0.0).unwrap();
    g.set_output("s", s).unwrap();
    g.set_update(a, t).unwrap(); // a <- b
    let (out, _) = check(&g);
    let names: Vec<&str> = out.ids().filter_map(|i| out.leaf_name(i)).collect();
    assert_eq!(names, ["a", "unused", "b"]);
    assert_eq!(out.updates[0].value, out.leaf("b").unwrap());
}

#[test]
fn node_order_follows_the_input_graph() {
    // Two independent chains, the second traced after the first: the output keeps that order
    // even though the second chain's leaf comes first.
    let mut g = Graph::new();
    let q = g.parameter("q", [3], DType::F32, Init::Zeros).unwrap();
    let p = g.parameter("p", [3], DType::F32, Init::Zeros).unwrap();
    let a1 = g.exp(p).unwrap();
    let a2 = g.mul_scalar(a1, 1.0).unwrap(); // disappears
    let a3 = g.tanh(a2).unwrap();
    let b1 = g.exp(q).unwrap();
    let b2 = g.tanh(b1).unwrap();
    g.set_output("b", b2).unwrap();
    g.set_output("a", a3).unwrap();
    let (s, _) = check(&g);
    let exp_p = s
        .ids()
        .find(|&i| s.node(i).op == Op::Unary(UnaryOp::Exp))
        .unwrap();
    assert_eq!(s.node(exp_p).inputs[0], s.leaf("p").unwrap());
    assert!(s.outputs["a"] < s.outputs["b"], "{s}");
}

#[test]
fn a_fused_graph_is_refused() {
    use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
    let (mut g, x) = with_x(&[3]);
    let k = FusedKernel {
        domain: vec![3],
        reduce_axes: vec![],
        inputs: vec![Input {
            dtype: DType::F32,
            len: 3,
            access: Access::contiguous(&[3]),
        }],
        body: vec![
            Inst::Load { input: 0 },
            Inst::Unary {
                op: UnaryOp::Exp,
                x: 0,
            },
        ],
        outputs: vec![Output { value: 1 }],
    };
    let f = g.push(Op::Fused(Box::new(k)), &[x], None).unwrap();
    g.set_output("y", f).unwrap();
    let e = simplify(&g, &RewriteOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("before fusion"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Type safety
// ---------------------------------------------------------------------------------------------

/// A broken rule: claims `transpose(x) == x`, whatever the shapes.
fn bogus_transpose(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in &eg[c].nodes {
        if let Kind::Transpose(_) = n.kind {
            out.push(Recipe::class(n.args[0]));
        }
    }
}

/// A broken rule: builds `exp` of a bool.
fn bogus_exp(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    if eg[c].data.ty.dtype == DType::Bool {
        out.push(Recipe::single(Kind::Unary(UnaryOp::Exp), &[c.into()]));
    }
}

#[test]
fn a_rule_that_equates_different_types_is_an_error_naming_both() {
    let (mut g, x) = with_x(&[2, 3]);
    let t = g.transpose(x, &[1, 0]).unwrap();
    g.set_output("t", t).unwrap();
    let bad = [Rule {
        name: "bogus",
        find: bogus_transpose,
        roots: u64::MAX,
        operands: 0,
    }];
    let e = simplify_with(&g, &RewriteOptions::default(), &bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bogus") && e.contains("f32[3,2]") && e.contains("f32[2,3]"),
        "{e}"
    );
}

#[test]
fn a_rule_that_builds_an_ill_typed_node_is_an_error() {
    let (mut g, x) = with_x(&[2]);
    let z = g.full(0.0, [2], DType::F32).unwrap();
    let c = g.compare(CmpOp::Gt, x, z).unwrap();
    g.set_output("c", c).unwrap();
    let bad = [Rule {
        name: "bogus-exp",
        find: bogus_exp,
        roots: u64::MAX,
        operands: 0,
    }];
    let e = simplify_with(&g, &RewriteOptions::default(), &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bogus-exp") && e.contains("ill-typed"), "{e}");
}

#[test]
fn merging_classes_of_different_types_is_recorded() {
    let mut eg = EGraph::new(Facts::default());
    let a = eg.add(ENode::leaf(Kind::full(1.0, Ty::of(&f32s(&[2])))));
    let b = eg.add(ENode::leaf(Kind::full(1.0, Ty::of(&f32s(&[3])))));
    eg.union(a, b);
    eg.rebuild();
    let e = eg.analysis.errors.join("; ");
    assert!(e.contains("f32[2]") && e.contains("f32[3]"), "{e}");
}

#[test]
fn merging_two_leaves_is_recorded() {
    let mut eg = EGraph::new(Facts {
        leaf_types: vec![f32s(&[2]), f32s(&[2])],
        ..Facts::default()
    });
    let a = eg.add(ENode::leaf(Kind::Leaf(0)));
    let b = eg.add(ENode::leaf(Kind::Leaf(1)));
    assert_ne!(
        eg.find(a),
        eg.find(b),
        "equal types do not make leaves equal"
    );
    eg.union(a, b);
    eg.rebuild();
    assert!(eg.analysis.errors.join("; ").contains("two leaves"));
}

#[test]
fn the_analysis_knows_types_and_constants() {
    let mut eg = EGraph::new(Facts::default());
    let two = eg.add(ENode::leaf(Kind::full(2.0, Ty::of(&f32s(&[])))));
    let b = eg.add(ENode::new(
        Kind::Broadcast([2, 2].into_iter().collect()),
        &[two],
    ));
    let e = eg.add(ENode::new(Kind::Unary(UnaryOp::Sqrt), &[b]));
    eg.rebuild();
    let d: &Data = &eg[e].data;
    assert_eq!(d.ty, f32s(&[2, 2]));
    assert_eq!(d.constant, Some(2f32.sqrt() as f64));
    assert!(eg.analysis.errors.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Extraction
// ---------------------------------------------------------------------------------------------

#[test]
fn extraction_is_safe_on_cyclic_classes() {
    // x * 1 == x puts `mul(x-class, one)` inside x's own class, and neg(neg(y)) == y puts
    // `neg(neg-class)` in y's class: both are cycles the extractor must step around.
    let (mut g, x) = with_x(&[3]);
    let one = g.full(1.0, [3], DType::F32).unwrap();
    let m = g.mul(x, one).unwrap();
    let y = g.exp(m).unwrap();
    let n = g.neg(y).unwrap();
    let nn = g.neg(n).unwrap();
    let z = g.mul(nn, n).unwrap();
    g.set_output("z", z).unwrap();
    let (s, _) = check(&g);
    assert_eq!(s.len(), 4, "{s}"); // x, exp, neg, mul

    // The shallowest-term extraction agrees here; drive both directly on this e-graph.
    let (eg, class_of, _) = to_egraph(&g).unwrap();
    let runner = egg::Runner::<ENode, Facts, ()>::new(Facts::default())
        .with_egraph(eg)
        .with_scheduler(egg::SimpleScheduler)
        .run(
            &rules::all()
                .into_iter()
                .map(Rule::rewrite)
                .collect::<Vec<_>>(),
        );
    let eg = runner.egraph;
    let root = eg.find(class_of[z.index()]);
    let dag = extract::extract(&eg, &[root]).unwrap();
    assert_eq!(dag.method, extract::Method::Dag);
    for m in [extract::Method::Dag, extract::Method::Shallowest] {
        let ex = extract::extract_with(&eg, &[root], Some(m)).unwrap();
        assert_eq!(ex.method, m);
        assert_eq!(ex.choice, dag.choice, "{m:?}");
    }
}

#[test]
fn extraction_counts_a_shared_value_once() {
    // One class holds two terms: add(s, s) with s = exp(sqrt(x)), three tensors when s counts
    // once (five when it counts per use, as a tree cost has it), and
    // neg(tanh(exp(recip(x)))), four tensors. The DAG cost takes the first.
    let mut eg = EGraph::new(Facts {
        leaf_types: vec![f32s(&[1000])],
        ..Facts::default()
    });
    let un = |eg: &mut EGraph, u: UnaryOp, a: Id| eg.add(ENode::new(Kind::Unary(u), &[a]));
    let x = eg.add(ENode::leaf(Kind::Leaf(0)));
    let s = un(&mut eg, UnaryOp::Sqrt, x);
    let s = un(&mut eg, UnaryOp::Exp, s);
    let a = eg.add(ENode::new(Kind::Binary(BinaryOp::Add), &[s, s]));
    let mut b = x;
    for u in [UnaryOp::Recip, UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Neg] {
        b = un(&mut eg, u, b);
    }
    eg.union(a, b);
    eg.rebuild();
    let ex = extract::extract(&eg, &[a]).unwrap();
    assert_eq!(ex.choice[&eg.find(a)].kind, Kind::Binary(BinaryOp::Add));
    assert_eq!(ex.choice.len(), 4); // add, exp, sqrt, x
}

#[test]
fn extraction_prefers_the_term_whose_shared_value_counts_once_above_a_common_chain() {
    // Above a chain of 40 exps both candidates read, one class holds add(s, s) with
    // s = exp(sqrt(c)) (three tensors counted as a DAG, five as a tree) and
    // mul(tanh(recip(c)), neg(c)) (four either way). Both are equally shallow, so the comparison
    // decides: it must count s once, and the chain (needed by both) not at all.
    let mut eg = EGraph::new(Facts {
        leaf_types: vec![f32s(&[1000])],
        ..Facts::default()
    });
    let un = |eg: &mut EGraph, u: UnaryOp, a: Id| eg.add(ENode::new(Kind::Unary(u), &[a]));
    let x = eg.add(ENode::leaf(Kind::Leaf(0)));
    let mut c = x;
    for _ in 0..40 {
        c = un(&mut eg, UnaryOp::Exp, c);
    }
    let s = un(&mut eg, UnaryOp::Sqrt, c);
    let s = un(&mut eg, UnaryOp::Exp, s);
    let a = eg.add(ENode::new(Kind::Binary(BinaryOp::Add), &[s, s]));
    let r = un(&mut eg, UnaryOp::Recip, c);
    let p = un(&mut eg, UnaryOp::Tanh, r);
    let q = un(&mut eg, UnaryOp::Neg, c);
    let b = eg.add(ENode::new(Kind::Binary(BinaryOp::Mul), &[p, q]));
    eg.union(a, b);
    eg.rebuild();
    let ex = extract::extract(&eg, &[a]).unwrap();
    assert_eq!(ex.choice[&eg.find(a)].kind, Kind::Binary(BinaryOp::Add));
    assert_eq!(ex.choice.len(), 3 + 40 + 1); // add, exp, sqrt, the chain and x
                                             // The shallowest-term extraction breaks the tie by the e-node's own cost alone.
    let sh = extract::extract_with(&eg, &[a], Some(extract::Method::Shallowest)).unwrap();
    assert_eq!(sh.method, extract::Method::Shallowest);
}

#[test]
fn a_broadcast_needed_elsewhere_does_not_keep_its_reduction() {
    // r = reduce_sum(broadcast(x)) over an expanded axis is x * full(n); the broadcast stays
    // for its other user only.
    let (mut g, x) = with_x(&[8, 1]);
    let b = g.broadcast_to(x, [8, 64]).unwrap();
    let r = g.sum(b, &[1]).unwrap();
    let e = g.exp(b).unwrap();
    g.set_output("r", r).unwrap();
    g.set_output("e", e).unwrap();
    let (s, _) = check(&g);
    assert_eq!(count(&s, "reduce_sum"), 0, "{s}");
    assert_eq!(count(&s, "broadcast"), 1, "{s}");
}

// ---------------------------------------------------------------------------------------------
// Whole steps, determinism, limits
// ---------------------------------------------------------------------------------------------

fn small_gpt_step() -> Graph {
    let m =
        models::by_name("gpt:vocab=16,d_model=8,layers=1,heads=2,d_ff=16,seq=4,batch=2").unwrap();
    autodiff::training_step(&m.graph, &m.optimizer)
        .unwrap()
        .graph
}

#[test]
fn a_small_gpt_step_saturates_shrinks_and_keeps_its_values() {
    let g = small_gpt_step();
    let (s, r) = check(&g);
    assert_eq!(r.stop_reason, "saturated");
    assert!(s.len() < g.len());
    assert!(r.bytes_after < r.bytes_before);
    assert_eq!(count(&s, "stop_gradient"), 0);
}

#[test]
fn simplifying_twice_gives_the_same_text_byte_for_byte() {
    let g = small_gpt_step();
    let (a, ra) = simplify(&g, &RewriteOptions::default()).unwrap();
    let (b, rb) = simplify(&g, &RewriteOptions::default()).unwrap();
    assert_eq!(text::print(&a), text::print(&b));
    assert_eq!(ra, rb);
    // And simplifying the result again changes nothing but may still find nothing to do.
    let (c, _) = simplify(&a, &RewriteOptions::default()).unwrap();
    assert!(c.len() <= a.len());
}

#[test]
fn an_iteration_limit_stops_the_run_and_the_result_is_still_valid() {
    let g = small_gpt_step();
    let opts = RewriteOptions {
        iter_limit: 1,
        ..RewriteOptions::default()
    };
    let (s, r) = simplify(&g, &opts).unwrap();
    assert!(
        r.stop_reason.contains("iteration limit"),
        "{}",
        r.stop_reason
    );
    assert_eq!(r.iterations, 1);
    s.verify().unwrap();
    assert_same_interface(&g, &s);
    assert_close(&results(&g), &results(&s), 1e-6);

    let opts = RewriteOptions {
        iter_limit: 0,
        ..RewriteOptions::default()
    };
    let (s, r) = simplify(&g, &opts).unwrap();
    assert!(
        r.stop_reason.contains("iteration limit"),
        "{}",
        r.stop_reason
    );
    assert_close(&results(&g), &results(&s), 1e-6);
}

#[test]
fn a_node_limit_stops_the_run_and_the_result_is_still_valid() {
    let g = small_gpt_step();
    let opts = RewriteOptions {
        node_limit: g.len() / 2,
        ..RewriteOptions::default()
    };
    let (s, r) = simplify(&g, &opts).unwrap();
    assert!(r.stop_reason.contains("node limit"), "{}", r.stop_reason);
    s.verify().unwrap();
    assert_same_interface(&g, &s);
    assert_close(&results(&g), &results(&s), 1e-6);
}

#[test]
fn a_time_limit_is_reported_as_such() {
    let g = small_gpt_step();
    let opts = RewriteOptions {
        time_limit: std::time::Duration::ZERO,
        ..RewriteOptions::default()
    };
    let (s, r) = simplify(&g, &opts).unwrap();
    assert!(r.stop_reason.contains("time limit"), "{}", r.stop_reason);
    s.verify().unwrap();
}

#[test]
fn the_report_lists_every_rule_in_order() {
    let g = small_gpt_step();
    let (_, r) = simplify(&g, &RewriteOptions::default()).unwrap();
    let names: Vec<&str> = r.rules_applied.iter().map(|(n, _)| n.as_str()).collect();
    let want: Vec<&str> = rules::all().iter().map(|r| r.name).collect();
    assert_eq!(names, want);
    let shown = r.to_string();
    assert!(
        shown.contains("saturated") && shown.contains("stop-gradient"),
        "{shown}"
    );
}

#[test]
fn a_rule_left_out_is_not_run_and_an_unknown_name_is_refused() {
    let g = small_gpt_step();
    let without = |names: &[&str]| RewriteOptions {
        without: names.iter().map(|n| n.to_string()).collect(),
        ..RewriteOptions::default()
    };
    let (_, r) = simplify(&g, &without(&["stop-gradient"])).unwrap();
    assert!(r.rules_applied.iter().all(|(n, _)| n != "stop-gradient"));
    assert_eq!(r.rules_applied.len(), rules::all().len() - 1);
    let e = simplify(&g, &without(&["no-such-rule"])).unwrap_err();
    assert!(e.to_string().contains("\"no-such-rule\""), "{e}");
}

#[test]
fn graphs_that_do_not_verify_are_refused_not_panicked_on() {
    let (mut g, x) = with_x(&[2]);
    g.set_output("x", x).unwrap();
    g.outputs.insert("dangling".into(), NodeId(99));
    assert!(simplify(&g, &RewriteOptions::default()).is_err());
}

#[test]
fn leaf_kinds_and_inits_survive() {
    let mut g = Graph::new();
    let p = g
        .parameter("p", [2], DType::F32, Init::Normal { std: 0.5 })
        .unwrap();
    let s = g.state("s", [2], DType::F32, Init::Ones).unwrap();
    let q = g.add(p, s).unwrap();
    g.set_update(s, q).unwrap();
    let (out, _) = check(&g);
    assert_eq!(out.leaves(LeafKind::State).len(), 1);
    assert_eq!(out.node(out.leaf("p").unwrap()).op, g.node(p).op);
}

// ---------------------------------------------------------------------------------------------
// Casts (bf16)
// ---------------------------------------------------------------------------------------------

/// A graph with one parameter `x` of `dtype`, converted through `path`, then `exp`.
fn cast_chain(dtype: DType, path: &[DType]) -> Graph {
    let mut g = Graph::new();
    let mut x = g
        .parameter("x", [5], dtype, Init::Normal { std: 1.0 })
        .unwrap();
    for &d in path {
        x = g.convert(x, d).unwrap();
    }
    let e = g.exp(x).unwrap();
    g.set_output("y", e).unwrap();
    g
}

#[test]
fn an_f32_round_trip_of_a_bf16_value_cancels() {
    let g = cast_chain(DType::BF16, &[DType::F32, DType::BF16]);
    let (s, r) = check(&g);
    assert!(fired(&r, "convert-of-exact-convert") >= 1);
    assert_eq!(count(&s, "convert"), 0, "{s}");
}

#[test]
fn a_bf16_round_trip_of_an_f32_value_is_kept_because_it_rounds() {
    let g = cast_chain(DType::F32, &[DType::BF16, DType::F32]);
    let (s, _) = check(&g);
    assert_eq!(count(&s, "convert"), 2, "{s}");
}

#[test]
fn a_widening_before_another_conversion_is_dropped() {
    // bf16 -> f32 -> f64 is bf16 -> f64; f32 -> bf16 -> f64 keeps its rounding step.
    let (s, _) = check(&cast_chain(DType::BF16, &[DType::F32, DType::F64]));
    assert_eq!(count(&s, "convert"), 1, "{s}");
    let (s, _) = check(&cast_chain(DType::F32, &[DType::BF16, DType::F64]));
    assert_eq!(count(&s, "convert"), 2, "{s}");
}

/// The exactness argument of `convert-of-exact-convert`, checked on the conversions
/// themselves: every bf16 survives f32 and f64 round trips bit for bit (NaN stays NaN), while
/// some f32 does not survive a bf16 round trip.
#[test]
fn bf16_widens_exactly_and_f32_does_not_narrow_exactly() {
    use ingot_kernels::dtype::bf16_from_f64;
    assert!(rules::holds_every_value(DType::BF16, DType::F32));
    assert!(rules::holds_every_value(DType::BF16, DType::F64));
    assert!(!rules::holds_every_value(DType::F32, DType::BF16));
    assert!(!rules::holds_every_value(DType::I32, DType::F32));
    for bits in 0..=u16::MAX {
        let b = ingot_kernels::dtype::bf16::from_bits(bits);
        let via_f32 = ingot_kernels::dtype::round_bf16(b.to_f32());
        let via_f64 = bf16_from_f64(b.to_f64());
        if b.is_nan() {
            assert!(via_f32.is_nan() && via_f64.is_nan());
        } else {
            assert_eq!(via_f32.to_bits(), bits);
            assert_eq!(via_f64.to_bits(), bits);
        }
    }
    let x = 1.0f32 + f32::EPSILON;
    assert_ne!(ingot_kernels::dtype::quantize_bf16(x), x);
}

#[test]
fn a_cast_of_a_broadcast_casts_the_small_operand() {
    let mut g = Graph::new();
    let b = g
        .parameter("b", [4], DType::F32, Init::Normal { std: 1.0 })
        .unwrap();
    let x = g
        .parameter("x", [3, 4], DType::BF16, Init::Normal { std: 1.0 })
        .unwrap();
    let bb = g.broadcast_to(b, [3, 4]).unwrap();
    let bc = g.convert(bb, DType::BF16).unwrap();
    let y = g.add(x, bc).unwrap();
    g.set_output("y", y).unwrap();
    let (s, r) = check(&g);
    assert!(fired(&r, "convert-of-broadcast") >= 1);
    let convert = s.nodes().iter().find(|n| n.op == Op::Convert).unwrap();
    assert_eq!(convert.ty.shape.dims(), &[4], "{s}");
}

// ---------------------------------------------------------------------------------------------
// The class index
// ---------------------------------------------------------------------------------------------

/// The step graphs of `spec` in f32 and bf16, before rewriting.
fn unrewritten_steps(spec: &str) -> Vec<Graph> {
    let model = models::by_name(spec).unwrap();
    [
        crate::precision::Precision::F32,
        crate::precision::Precision::Bf16,
    ]
    .into_iter()
    .map(|precision| {
        let opts = crate::pipeline::Options {
            rewrite: None,
            precision: Some(precision),
            ..crate::pipeline::Options::for_target(crate::lower::Target::Cpu)
        };
        crate::pipeline::rewritten(&model, &Default::default(), &opts)
            .unwrap()
            .graph
    })
    .collect()
}

/// Each rule finds nothing in every class of `eg` that holds none of its roots, nor in one
/// whose e-nodes read no class holding any of its operands' bits; returns how many (rule,
/// class) pairs found something.
fn assert_roots_cover_matches(eg: &EGraph, what: &str) -> usize {
    let mut found = 0;
    for rule in rules::all() {
        for class in eg.classes() {
            let mut out = Vec::new();
            (rule.find)(eg, class.id, &mut out);
            let bits = super::index::class_bits(class);
            let operands = (class.nodes.iter())
                .flat_map(|n| n.args.iter())
                .fold(0, |m, &a| m | super::index::class_bits(&eg[a]));
            assert!(
                out.is_empty() || bits & rule.roots != 0,
                "{what}: rule {} matched class {} ({:?}) outside its roots",
                rule.name,
                class.id,
                class.nodes
            );
            assert!(
                out.is_empty() || rule.operands == 0 || operands & rule.operands != 0,
                "{what}: rule {} matched class {} ({:?}) whose operands hold none of its operand bits",
                rule.name,
                class.id,
                class.nodes
            );
            found += usize::from(!out.is_empty());
        }
    }
    found
}

#[test]
fn a_rule_finds_nothing_in_a_class_that_holds_none_of_its_roots_or_operands() {
    let mut found = 0;
    for spec in [
        "mlp",
        "gpt:vocab=16,d_model=8,layers=1,heads=2,d_ff=16,seq=4,batch=2",
        "cnn",
    ] {
        for g in unrewritten_steps(spec) {
            // The e-graph as built, and after saturation (classes holding many e-nodes).
            let (eg, _, _) = to_egraph(&g).unwrap();
            found += assert_roots_cover_matches(&eg, spec);
            let opts = RewriteOptions::default();
            let runner = saturate(eg, &opts, &rules::all());
            assert_eq!(describe(runner.stop_reason.as_ref(), &opts), "saturated");
            let mut eg = runner.egraph;
            eg.rebuild();
            found += assert_roots_cover_matches(&eg, spec);
        }
    }
    // The check saw the rules at work.
    assert!(found > 100, "{found}");
}

#[test]
fn searching_the_indexed_classes_finds_what_searching_every_class_finds() {
    let every: Vec<Rule> = rules::all()
        .into_iter()
        .map(|r| Rule {
            roots: u64::MAX,
            operands: 0,
            ..r
        })
        .collect();
    for g in unrewritten_steps("gpt:vocab=16,d_model=8,layers=1,heads=2,d_ff=16,seq=4,batch=2") {
        let (a, ra) = simplify(&g, &RewriteOptions::default()).unwrap();
        let (b, rb) = simplify_with(&g, &RewriteOptions::default(), &every).unwrap();
        assert_eq!(text::print(&a), text::print(&b));
        assert_eq!(ra, rb);
        assert!(ra.rules_applied.iter().any(|(_, n)| *n > 0));
    }
}

/// The operand bits narrow the search: of a small GPT's additions (its step as built), the
/// index lists for `add-neg` only those reading a class that holds a negation, fewer than all
/// of them, and for `mul-one` only products reading a class of known value.
#[test]
fn the_index_passes_by_the_classes_whose_operands_hold_none_of_a_rules_operand_bits() {
    use super::index::{class_bits, ClassIndex};
    let all = rules::all();
    let rule = |name: &str| *all.iter().find(|r| r.name == name).unwrap();
    for g in unrewritten_steps("gpt:vocab=16,d_model=8,layers=2,heads=2,d_ff=16,seq=4,batch=2") {
        let (mut eg, _, _) = to_egraph(&g).unwrap();
        eg.rebuild();
        ClassIndex::build(&mut eg);
        for r in [rule("add-neg"), rule("mul-one")] {
            let every = ClassIndex::matching(&eg, r.roots, 0);
            let listed = ClassIndex::matching(&eg, r.roots, r.operands);
            assert!(
                listed.len() < every.len(),
                "{}: {} of {} classes listed",
                r.name,
                listed.len(),
                every.len()
            );
            for &id in &every {
                let reads = (eg[id].nodes.iter())
                    .flat_map(|n| n.args.iter())
                    .any(|&a| class_bits(&eg[a]) & r.operands != 0);
                assert_eq!(listed.contains(&id), reads, "{}: class {id}", r.name);
            }
        }
    }
}
