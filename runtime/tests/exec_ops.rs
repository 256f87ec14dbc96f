//! Every op of the IR, executed by the CPU backend, against an independent naive implementation
//! written here (nested loops over multi-indices, in f64), on small random shapes.

use indexmap::IndexMap;
use ingot_compiler::error::IrError;
use ingot_compiler::ir::{
    BinaryOp, CmpOp, DType, Graph, Init, LeafKind, Node, NodeId, Op, Shape, TensorType, UnaryOp,
};
use ingot_runtime::cpu::{exec_node, run_graph};
use ingot_runtime::{ExecError, Tensor, View};
// The test kit's counting allocator, included by path: the test kit builds on the trainer, a
// layer above the runtime, which the runtime may not name even for its tests (layers.rs).
#[path = "../../testkit/src/counting.rs"]
mod counting;
use counting::allocations;

// ---------------------------------------------------------------------------------------------
// Test scaffolding: a seeded generator, tensors from f64 values, multi-index helpers.

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A random shape of `rank` axes, sizes 1..=max (size 1 appears often on purpose).
    fn dims(&mut self, rank: usize, max: usize) -> Vec<usize> {
        (0..rank)
            .map(|_| {
                if self.below(4) == 0 {
                    1
                } else {
                    1 + self.below(max)
                }
            })
            .collect()
    }
    /// Values that suit `dtype`: floats in [-2, 2), integers in [-50, 50), bools 0/1.
    fn values(&mut self, dtype: DType, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| match dtype {
                DType::F32 | DType::F64 | DType::BF16 => self.uniform() * 4.0 - 2.0,
                DType::I32 | DType::I64 => self.below(100) as f64 - 50.0,
                DType::Bool => self.below(2) as f64,
            })
            .collect()
    }
}

fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// A tensor holding `values` converted to `dtype`.
fn tensor(dtype: DType, dims: &[usize], values: &[f64]) -> Tensor {
    let shape = Shape::new(dims);
    match dtype {
        DType::F32 => Tensor::from_f32(shape, values.iter().map(|&v| v as f32).collect()),
        DType::F64 => Tensor::from_f64(shape, values.to_vec()),
        DType::I32 => Tensor::from_i32(shape, values.iter().map(|&v| v as i32).collect()),
        DType::I64 => Tensor::from_i64(shape, values.iter().map(|&v| v as i64).collect()),
        DType::Bool => Tensor::from_bool(shape, values.iter().map(|&v| v != 0.0).collect()),
        DType::BF16 => Tensor::from_vec(
            shape,
            values
                .iter()
                .map(|&v| ingot_kernels::dtype::bf16_from_f64(v))
                .collect(),
        ),
    }
}

/// Every multi-index of `dims`, in row-major order.
fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &d in dims {
        out = out
            .into_iter()
            .flat_map(|p| (0..d).map(move |i| [p.clone(), vec![i]].concat()))
            .collect();
    }
    out
}

/// The row-major position of a multi-index.
fn flat(idx: &[usize], dims: &[usize]) -> usize {
    let mut f = 0;
    for (i, d) in idx.iter().zip(dims) {
        assert!(i < d);
        f = f * d + i;
    }
    f
}

/// Values rounded to what `dtype` holds (so f32 expectations are compared as f32).
fn rounded(dtype: DType, v: &[f64]) -> Vec<f64> {
    tensor(dtype, &[v.len()], v).to_f64_vec()
}

/// Leaf values by name, as `run_graph` takes them.
fn named(leaves: Vec<(&str, Tensor)>) -> IndexMap<String, Tensor> {
    leaves
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect()
}

/// Runs a graph with the named leaf values and returns its named outputs.
fn run(g: &Graph, leaves: Vec<(&str, Tensor)>) -> IndexMap<String, Tensor> {
    run_graph(g, &named(leaves))
        .unwrap_or_else(|e| panic!("run_graph failed: {e}"))
        .outputs
}

/// Runs the graph that `build` makes over one input per leaf value (named, shaped and typed as
/// the value, in order), its outputs the named nodes `build` returns: the outputs' values.
fn run_ops(
    leaves: Vec<(&str, Tensor)>,
    build: impl FnOnce(&mut Graph, &[NodeId]) -> Vec<(&'static str, NodeId)>,
) -> IndexMap<String, Tensor> {
    let mut g = Graph::new();
    let inputs: Vec<NodeId> = leaves
        .iter()
        .map(|(n, t)| g.input(n, t.ty.shape.clone(), t.dtype()).unwrap())
        .collect();
    for (name, id) in build(&mut g, &inputs) {
        g.set_output(name, id).unwrap();
    }
    run(&g, leaves)
}

/// [`run_ops`] of a graph of one output: its value.
fn run_op(
    leaves: Vec<(&str, Tensor)>,
    build: impl FnOnce(&mut Graph, &[NodeId]) -> Result<NodeId, IrError>,
) -> Tensor {
    let mut out = run_ops(leaves, |g, x| vec![("y", build(g, x).unwrap())]);
    out.shift_remove("y").unwrap()
}

fn assert_exact(got: &Tensor, want_dims: &[usize], want: &[f64], what: &str) {
    assert_eq!(got.dims(), want_dims, "{what}: shape");
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        assert!(
            a == b || (a.is_nan() && b.is_nan()),
            "{what}: element {i} is {a}, expected {b}\n got {g:?}\nwant {want:?}"
        );
    }
}

/// `|got - want| <= tol * scale` per element, where `scale` is given per element.
fn assert_close(
    got: &Tensor,
    want_dims: &[usize],
    want: &[f64],
    scale: &[f64],
    tol: f64,
    what: &str,
) {
    assert_eq!(got.dims(), want_dims, "{what}: shape");
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{what}: length");
    for (i, ((a, b), s)) in g.iter().zip(want).zip(scale).enumerate() {
        assert!(
            (a - b).abs() <= tol * s.max(1e-30),
            "{what}: element {i} is {a}, expected {b} (tolerance {})",
            tol * s
        );
    }
}

fn float_tol(dtype: DType) -> f64 {
    if dtype == DType::F32 {
        2e-6
    } else {
        1e-13
    }
}

const FLOATS: [DType; 2] = [DType::F32, DType::F64];
const NUMERIC: [DType; 4] = [DType::F32, DType::F64, DType::I32, DType::I64];

// ---------------------------------------------------------------------------------------------
// Naive reference implementations: one loop over output multi-indices each.

fn naive_broadcast(src: &[usize], x: &[f64], dst: &[usize]) -> Vec<f64> {
    let off = dst.len() - src.len();
    indices(dst)
        .iter()
        .map(|i| {
            let s: Vec<usize> = (0..src.len())
                .map(|a| if src[a] == 1 { 0 } else { i[off + a] })
                .collect();
            x[flat(&s, src)]
        })
        .collect()
}

fn naive_transpose(src: &[usize], x: &[f64], perm: &[usize]) -> (Vec<usize>, Vec<f64>) {
    let dst: Vec<usize> = perm.iter().map(|&p| src[p]).collect();
    let v = indices(&dst)
        .iter()
        .map(|i| {
            let mut s = vec![0; src.len()];
            for (k, &p) in perm.iter().enumerate() {
                s[p] = i[k];
            }
            x[flat(&s, src)]
        })
        .collect();
    (dst, v)
}

fn naive_reduce(src: &[usize], x: &[f64], axes: &[usize], max: bool) -> (Vec<usize>, Vec<f64>) {
    let dst: Vec<usize> = src
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let mut out = vec![if max { f64::NEG_INFINITY } else { 0.0 }; numel(&dst)];
    for i in indices(src) {
        let mut o = i.clone();
        for &a in axes {
            o[a] = 0;
        }
        let (f, v) = (flat(&o, &dst), x[flat(&i, src)]);
        out[f] = if max { out[f].max(v) } else { out[f] + v };
    }
    (dst, out)
}

/// Sums of absolute values, the scale of a sum's rounding error.
fn naive_abs_reduce(src: &[usize], x: &[f64], axes: &[usize]) -> Vec<f64> {
    let ax: Vec<f64> = x.iter().map(|v| v.abs()).collect();
    naive_reduce(src, &ax, axes, false).1
}

fn naive_matmul(
    a_dims: &[usize],
    a: &[f64],
    b_dims: &[usize],
    b: &[f64],
    abs: bool,
) -> (Vec<usize>, Vec<f64>) {
    let r = a_dims.len();
    let (m, k, n) = (a_dims[r - 2], a_dims[r - 1], b_dims[r - 1]);
    let mut dst = a_dims.to_vec();
    dst[r - 1] = n;
    let v = indices(&dst)
        .iter()
        .map(|i| {
            let (bi, row, col) = (&i[..r - 2], i[r - 2], i[r - 1]);
            assert!(row < m);
            (0..k)
                .map(|p| {
                    let ai = [bi, &[row, p]].concat();
                    let bj = [bi, &[p, col]].concat();
                    let t = a[flat(&ai, a_dims)] * b[flat(&bj, b_dims)];
                    if abs {
                        t.abs()
                    } else {
                        t
                    }
                })
                .sum()
        })
        .collect();
    (dst, v)
}

// ---------------------------------------------------------------------------------------------
// Elementwise ops.

#[test]
fn unary_float_ops_match_std_per_element() {
    let mut rng = Rng(1);
    for dtype in FLOATS {
        for (u, f) in [
            (UnaryOp::Neg, (|x: f64| -x) as fn(f64) -> f64),
            (UnaryOp::Exp, f64::exp),
            (UnaryOp::Log, f64::ln),
            (UnaryOp::Sqrt, f64::sqrt),
            (UnaryOp::Tanh, f64::tanh),
            (UnaryOp::Recip, |x| 1.0 / x),
        ] {
            let dims = rng.dims(3, 5);
            let mut x = rng.values(dtype, numel(&dims));
            if matches!(u, UnaryOp::Log | UnaryOp::Sqrt) {
                x.iter_mut().for_each(|v| *v = v.abs() + 0.01);
            }
            let x = rounded(dtype, &x);
            let out = run_op(vec![("x", tensor(dtype, &dims, &x))], |g, a| {
                g.unary(u, a[0])
            });
            let want: Vec<f64> = x.iter().map(|&v| f(v)).collect();
            let scale: Vec<f64> = want.iter().map(|v| v.abs()).collect();
            assert_close(
                &out,
                &dims,
                &want,
                &scale,
                float_tol(dtype),
                &format!("{u:?} {dtype}"),
            );
        }
    }
}

#[test]
fn integer_neg_wraps_instead_of_overflowing() {
    let x = Tensor::from_i32([3], vec![i32::MIN, 5, 0]);
    let out = run_op(vec![("x", x)], |g, a| g.neg(a[0]));
    assert_eq!(out.as_i32().unwrap(), &[i32::MIN, -5, 0]);
}

#[test]
fn binary_ops_match_naive_on_floats_and_integers() {
    let mut rng = Rng(2);
    for dtype in NUMERIC {
        for &b in BinaryOp::ALL {
            if b == BinaryOp::Div && !dtype.is_float() {
                continue;
            }
            let rank = rng.below(4);
            let dims = rng.dims(rank, 6);
            let x = rounded(dtype, &rng.values(dtype, numel(&dims)));
            let mut y = rounded(dtype, &rng.values(dtype, numel(&dims)));
            if b == BinaryOp::Div {
                y.iter_mut()
                    .for_each(|v| *v = if v.abs() < 0.1 { 0.5 } else { *v });
            }
            let (a, c) = (tensor(dtype, &dims, &x), tensor(dtype, &dims, &y));
            let out = run_op(vec![("a", a), ("b", c)], |g, v| g.binary(b, v[0], v[1]));
            let f = |p: f64, q: f64| match b {
                BinaryOp::Add => p + q,
                BinaryOp::Sub => p - q,
                BinaryOp::Mul => p * q,
                BinaryOp::Div => p / q,
                BinaryOp::Max => p.max(q),
                BinaryOp::Min => p.min(q),
            };
            let want: Vec<f64> = x.iter().zip(&y).map(|(&p, &q)| f(p, q)).collect();
            // The f32 result is the f64 result rounded once (exact for ints in range).
            let want = rounded(dtype, &want);
            if dtype == DType::F32 && b == BinaryOp::Div {
                let scale: Vec<f64> = want.iter().map(|v| v.abs()).collect();
                assert_close(&out, &dims, &want, &scale, 2e-7, &format!("{b:?} {dtype}"));
            } else {
                assert_exact(&out, &dims, &want, &format!("{b:?} {dtype}"));
            }
        }
    }
}

/// `a op b` for each of the two `ops`, computed in one graph.
fn two_binary_ops(a: Tensor, b: Tensor, ops: [BinaryOp; 2]) -> (Tensor, Tensor) {
    let mut out = run_ops(vec![("a", a), ("b", b)], |g, x| {
        let first = g.binary(ops[0], x[0], x[1]).unwrap();
        vec![("0", first), ("1", g.binary(ops[1], x[0], x[1]).unwrap())]
    });
    (
        out.shift_remove("0").unwrap(),
        out.shift_remove("1").unwrap(),
    )
}

#[test]
fn integer_arithmetic_wraps_instead_of_panicking() {
    let a = Tensor::from_i64([2], vec![i64::MAX, 3]);
    let b = Tensor::from_i64([2], vec![1, i64::MAX]);
    let (s, m) = two_binary_ops(a, b, [BinaryOp::Add, BinaryOp::Mul]);
    assert_eq!(s.as_i64().unwrap(), &[i64::MIN, i64::MAX.wrapping_add(3)]);
    assert_eq!(m.as_i64().unwrap(), &[i64::MAX, i64::MAX.wrapping_mul(3)]);
}

#[test]
fn float_max_and_min_propagate_a_nan_operand() {
    let a = Tensor::from_f32([2], vec![f32::NAN, 1.0]);
    let b = Tensor::from_f32([2], vec![2.0, f32::NAN]);
    let (max, min) = two_binary_ops(a, b, [BinaryOp::Max, BinaryOp::Min]);
    // As PyTorch's maximum/minimum and XLA's max/min (f32::max would drop the NaN).
    assert!(max.as_f32().unwrap().iter().all(|v| v.is_nan()));
    assert!(min.as_f32().unwrap().iter().all(|v| v.is_nan()));
}

#[test]
fn comparisons_give_bools_zero_or_one_for_every_dtype() {
    let mut rng = Rng(3);
    for dtype in [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool] {
        for &c in CmpOp::ALL {
            let dims = rng.dims(2, 5);
            let x = rounded(dtype, &rng.values(dtype, numel(&dims)));
            // Half the elements equal, so Eq/Le/Ge see ties.
            let y: Vec<f64> = x
                .iter()
                .zip(rounded(dtype, &rng.values(dtype, numel(&dims))))
                .map(|(&p, q)| if rng.below(2) == 0 { p } else { q })
                .collect();
            let (a, b) = (tensor(dtype, &dims, &x), tensor(dtype, &dims, &y));
            let out = run_op(vec![("a", a), ("b", b)], |g, v| g.compare(c, v[0], v[1]));
            assert_eq!(out.dtype(), DType::Bool);
            let want: Vec<f64> = x
                .iter()
                .zip(&y)
                .map(|(p, q)| {
                    (match c {
                        CmpOp::Lt => p < q,
                        CmpOp::Le => p <= q,
                        CmpOp::Gt => p > q,
                        CmpOp::Ge => p >= q,
                        CmpOp::Eq => p == q,
                        CmpOp::Ne => p != q,
                    }) as u8 as f64
                })
                .collect();
            assert_exact(&out, &dims, &want, &format!("{c:?} {dtype}"));
        }
    }
}

#[test]
fn nan_compares_unequal_to_everything() {
    let a = Tensor::from_f64([2], vec![f64::NAN, 1.0]);
    let out = run_ops(vec![("a", a)], |g, x| {
        let eq = g.compare(CmpOp::Eq, x[0], x[0]).unwrap();
        vec![
            ("eq", eq),
            ("ne", g.compare(CmpOp::Ne, x[0], x[0]).unwrap()),
        ]
    });
    assert_eq!(out["eq"].as_bool().unwrap(), &[0, 1]);
    assert_eq!(out["ne"].as_bool().unwrap(), &[1, 0]);
}

#[test]
fn select_takes_a_where_the_condition_holds_and_b_elsewhere() {
    let mut rng = Rng(4);
    for dtype in [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool] {
        let dims = rng.dims(3, 4);
        let n = numel(&dims);
        let (c, x, y) = (
            rng.values(DType::Bool, n),
            rounded(dtype, &rng.values(dtype, n)),
            rounded(dtype, &rng.values(dtype, n)),
        );
        let leaves = vec![
            ("c", tensor(DType::Bool, &dims, &c)),
            ("a", tensor(dtype, &dims, &x)),
            ("b", tensor(dtype, &dims, &y)),
        ];
        let out = run_op(leaves, |g, v| g.select(v[0], v[1], v[2]));
        let want: Vec<f64> = (0..n)
            .map(|i| if c[i] != 0.0 { x[i] } else { y[i] })
            .collect();
        assert_exact(&out, &dims, &want, &format!("select {dtype}"));
    }
}

#[test]
fn convert_between_every_pair_of_dtypes_follows_rust_as_casts() {
    let src_vals = [-2.7, -1.0, -0.5, 0.0, 0.4, 1.0, 2.9, 3e9, -3e9, f64::NAN];
    for from in [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool] {
        // Values the source dtype can hold.
        let vals: Vec<f64> = match from {
            DType::F32 | DType::F64 | DType::BF16 => src_vals.to_vec(),
            DType::I32 => vec![-7.0, 0.0, 1.0, 2147483647.0, -2147483648.0],
            DType::I64 => vec![-7.0, 0.0, 1.0, 9e15, -5e12],
            DType::Bool => vec![0.0, 1.0, 1.0],
        };
        let src = tensor(from, &[vals.len()], &vals);
        let xs = src.to_f64_vec();
        for to in [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool] {
            if to == from {
                continue;
            }
            let out = run_op(vec![("x", src.clone())], |g, x| g.convert(x[0], to));
            // The expectation, cast by cast from the source's own type.
            let want: Vec<f64> = xs
                .iter()
                .map(|&x| match (from, to) {
                    (_, DType::Bool) => (x != 0.0) as u8 as f64,
                    (DType::F32 | DType::F64, DType::I32) => (x as i32) as f64,
                    (DType::F32 | DType::F64, DType::I64) => (x as i64) as f64,
                    (DType::F64, DType::F32) => (x as f32) as f64,
                    (DType::I64, DType::I32) => (x as i64 as i32) as f64,
                    (DType::I64 | DType::I32, DType::F32) => (x as i64 as f32) as f64,
                    _ => x,
                })
                .collect();
            assert_exact(
                &out,
                &[vals.len()],
                &want,
                &format!("convert {from} -> {to}"),
            );
        }
    }
}

#[test]
fn full_and_iota_fill_as_documented() {
    let mut g = Graph::new();
    let f = g.full(-2.75, [2, 3], DType::I32).unwrap();
    let t = g.full(0.5, [2], DType::Bool).unwrap();
    let i0 = g.iota([2, 3, 2], 1, DType::F32).unwrap();
    let i1 = g.iota([3, 2], 0, DType::I64).unwrap();
    for (n, id) in [("f", f), ("t", t), ("i0", i0), ("i1", i1)] {
        g.set_output(n, id).unwrap();
    }
    let out = run(&g, vec![]);
    assert_eq!(out["f"].as_i32().unwrap(), &[-2; 6]);
    assert_eq!(out["t"].as_bool().unwrap(), &[1, 1]);
    let want: Vec<f64> = indices(&[2, 3, 2]).iter().map(|i| i[1] as f64).collect();
    assert_exact(&out["i0"], &[2, 3, 2], &want, "iota axis 1");
    assert_eq!(out["i1"].as_i64().unwrap(), &[0, 0, 1, 1, 2, 2]);
}

// ---------------------------------------------------------------------------------------------
// Data movement.

#[test]
fn broadcast_follows_numpy_rules_including_scalars_and_size_one_axes() {
    let mut rng = Rng(5);
    let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (vec![], vec![3, 4]),
        (vec![], vec![]),
        (vec![1], vec![2, 3]),
        (vec![4], vec![3, 4]),
        (vec![3, 1], vec![3, 4]),
        (vec![1, 4], vec![3, 4]),
        (vec![1, 1], vec![2, 3]),
        (vec![2, 1, 4], vec![3, 2, 5, 4]),
        (vec![5, 1, 1], vec![5, 2, 3]),
        (vec![1, 3, 1, 2], vec![2, 3, 4, 2]),
    ];
    for dtype in [DType::F32, DType::F64, DType::I64, DType::Bool] {
        for (src, dst) in &cases {
            let x = rounded(dtype, &rng.values(dtype, numel(src)));
            let to = TensorType::new(Shape::new(dst), dtype);
            let out = run_op(vec![("x", tensor(dtype, src, &x))], |g, a| {
                g.push(Op::Broadcast, &[a[0]], Some(to))
            });
            assert_exact(
                &out,
                dst,
                &naive_broadcast(src, &x, dst),
                &format!("broadcast {src:?} -> {dst:?} {dtype}"),
            );
        }
    }
}

#[test]
fn binary_ops_with_builder_broadcasting_match_naive() {
    let mut rng = Rng(6);
    for dtype in FLOATS {
        for (sa, sb) in [
            (vec![4, 1], vec![3]),
            (vec![], vec![2, 3]),
            (vec![2, 1, 3], vec![4, 1]),
            (vec![1], vec![1, 1, 5]),
        ] {
            let x = rounded(dtype, &rng.values(dtype, numel(&sa)));
            let y = rounded(dtype, &rng.values(dtype, numel(&sb)));
            let mut g = Graph::new();
            let a = g.input("a", Shape::new(&sa), dtype).unwrap();
            let b = g.input("b", Shape::new(&sb), dtype).unwrap();
            let r = g.add(a, b).unwrap();
            g.set_output("r", r).unwrap();
            let dst = g.ty(r).shape.dims().to_vec();
            let out = run(
                &g,
                vec![("a", tensor(dtype, &sa, &x)), ("b", tensor(dtype, &sb, &y))],
            );
            let (bx, by) = (
                naive_broadcast(&sa, &x, &dst),
                naive_broadcast(&sb, &y, &dst),
            );
            let want = rounded(
                dtype,
                &bx.iter().zip(&by).map(|(p, q)| p + q).collect::<Vec<_>>(),
            );
            assert_exact(&out["r"], &dst, &want, &format!("{sa:?} + {sb:?}"));
        }
    }
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = vec![];
    for p in permutations(n - 1) {
        for pos in 0..n {
            let mut q = p.clone();
            q.insert(pos, n - 1);
            out.push(q);
        }
    }
    out
}

#[test]
fn every_transpose_of_rank_2_3_and_4_matches_naive() {
    let mut rng = Rng(7);
    for dtype in [DType::F32, DType::F64, DType::I32] {
        for rank in 2..=4 {
            for perm in permutations(rank) {
                let src = rng.dims(rank, if rank == 4 { 5 } else { 9 });
                let x = rounded(dtype, &rng.values(dtype, numel(&src)));
                let op = Op::Transpose {
                    perm: perm.iter().copied().collect(),
                };
                let out = run_op(vec![("x", tensor(dtype, &src, &x))], |g, a| {
                    g.push(op, &[a[0]], None)
                });
                let (dst, want) = naive_transpose(&src, &x, &perm);
                assert_exact(&out, &dst, &want, &format!("transpose {src:?} by {perm:?}"));
            }
        }
    }
}

#[test]
fn a_large_transpose_of_the_last_two_axes_matches_naive() {
    let mut rng = Rng(8);
    let src = [3, 70, 45];
    let x = rng.values(DType::F64, numel(&src));
    let out = run_op(vec![("x", tensor(DType::F64, &src, &x))], |g, a| {
        g.transpose_last(a[0])
    });
    let (dst, want) = naive_transpose(&src, &x, &[0, 2, 1]);
    assert_exact(&out, &dst, &want, "transpose_last");
}

#[test]
fn reshape_keeps_row_major_order() {
    let x: Vec<f64> = (0..24).map(|i| i as f64).collect();
    let out = run_op(vec![("x", tensor(DType::F32, &[2, 3, 4], &x))], |g, a| {
        g.reshape(a[0], [4, 6])
    });
    assert_exact(&out, &[4, 6], &x, "reshape");
}

#[test]
fn slice_along_each_axis_matches_naive() {
    let mut rng = Rng(9);
    for dtype in [DType::F32, DType::F64, DType::I64] {
        for _ in 0..10 {
            let rank = 1 + rng.below(4);
            let src: Vec<usize> = (0..rank).map(|_| 1 + rng.below(6)).collect();
            let axis = rng.below(rank);
            let start = rng.below(src[axis]);
            let end = start + 1 + rng.below(src[axis] - start);
            let x = rounded(dtype, &rng.values(dtype, numel(&src)));
            let out = run_op(vec![("x", tensor(dtype, &src, &x))], |g, a| {
                g.slice(a[0], axis, start, end)
            });
            let mut dst = src.clone();
            dst[axis] = end - start;
            let want: Vec<f64> = indices(&dst)
                .iter()
                .map(|i| {
                    let mut j = i.clone();
                    j[axis] += start;
                    x[flat(&j, &src)]
                })
                .collect();
            assert_exact(
                &out,
                &dst,
                &want,
                &format!("slice {src:?} axis {axis} [{start}, {end})"),
            );
        }
    }
}

#[test]
fn concat_along_each_axis_matches_naive() {
    let mut rng = Rng(10);
    for dtype in [DType::F32, DType::F64, DType::I32, DType::Bool] {
        for rank in 1..=4 {
            for axis in 0..rank {
                let base = rng.dims(rank, 4);
                let parts: Vec<Vec<usize>> = (0..1 + rng.below(3))
                    .map(|_| {
                        let mut d = base.clone();
                        d[axis] = 1 + rng.below(3);
                        d
                    })
                    .collect();
                let xs: Vec<Vec<f64>> = parts
                    .iter()
                    .map(|d| rounded(dtype, &rng.values(dtype, numel(d))))
                    .collect();
                let mut g = Graph::new();
                let ids: Vec<NodeId> = parts
                    .iter()
                    .enumerate()
                    .map(|(i, d)| g.input(&format!("p{i}"), Shape::new(d), dtype).unwrap())
                    .collect();
                let c = g.concat(&ids, axis).unwrap();
                g.set_output("y", c).unwrap();
                let names: Vec<String> = (0..parts.len()).map(|i| format!("p{i}")).collect();
                let leaves = parts
                    .iter()
                    .zip(&xs)
                    .zip(&names)
                    .map(|((d, x), n)| (n.as_str(), tensor(dtype, d, x)))
                    .collect();
                let out = run(&g, leaves);
                let mut dst = base.clone();
                dst[axis] = parts.iter().map(|d| d[axis]).sum();
                let want: Vec<f64> = indices(&dst)
                    .iter()
                    .map(|i| {
                        let (mut j, mut p) = (i.clone(), 0);
                        while j[axis] >= parts[p][axis] {
                            j[axis] -= parts[p][axis];
                            p += 1;
                        }
                        xs[p][flat(&j, &parts[p])]
                    })
                    .collect();
                assert_exact(
                    &out["y"],
                    &dst,
                    &want,
                    &format!("concat {parts:?} axis {axis}"),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions and products.

#[test]
fn reduce_sum_and_max_over_every_axis_subset_match_naive() {
    let mut rng = Rng(11);
    for dtype in NUMERIC {
        for rank in 1..=4 {
            for subset in 1u32..(1 << rank) {
                let axes: Vec<usize> = (0..rank).filter(|a| subset & (1 << a) != 0).collect();
                let src = rng.dims(rank, 6);
                let x = rounded(dtype, &rng.values(dtype, numel(&src)));
                for max in [false, true] {
                    let out = run_op(vec![("x", tensor(dtype, &src, &x))], |g, a| {
                        if max {
                            g.max(a[0], &axes)
                        } else {
                            g.sum(a[0], &axes)
                        }
                    });
                    let (dst, want) = naive_reduce(&src, &x, &axes, max);
                    let what = format!(
                        "{} {src:?} over {axes:?} {dtype}",
                        if max { "max" } else { "sum" }
                    );
                    if max || !dtype.is_float() {
                        assert_exact(&out, &dst, &want, &what);
                    } else {
                        let scale = naive_abs_reduce(&src, &x, &axes);
                        assert_close(&out, &dst, &want, &scale, float_tol(dtype) * 4.0, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn long_f32_sums_are_accurate_and_bit_identical_run_to_run() {
    let mut rng = Rng(12);
    let src = [7, 3000];
    let x = rounded(DType::F32, &rng.values(DType::F32, numel(&src)));
    let mut g = Graph::new();
    let a = g.input("x", src, DType::F32).unwrap();
    let s1 = g.sum(a, &[1]).unwrap();
    let s0 = g.sum(a, &[0]).unwrap();
    let all = g.sum_all(a).unwrap();
    for (n, id) in [("s1", s1), ("s0", s0), ("all", all)] {
        g.set_output(n, id).unwrap();
    }
    let first = run(&g, vec![("x", tensor(DType::F32, &src, &x))]);
    for (name, axes) in [("s1", vec![1]), ("s0", vec![0]), ("all", vec![0, 1])] {
        let (_, want) = naive_reduce(&src, &x, &axes, false);
        let scale = naive_abs_reduce(&src, &x, &axes);
        let dims = first[name].dims().to_vec();
        assert_close(&first[name], &dims, &want, &scale, 1e-6, name);
    }
    for _ in 0..3 {
        let again = run(&g, vec![("x", tensor(DType::F32, &src, &x))]);
        for (name, t) in &first {
            let bits = |t: &Tensor| {
                t.as_f32()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(t), bits(&again[name]), "{name} changed between runs");
        }
    }
}

#[test]
fn batched_matmul_matches_naive_for_ranks_2_to_4() {
    let mut rng = Rng(13);
    for dtype in FLOATS {
        for rank in 2..=4 {
            for _ in 0..6 {
                let batch = rng.dims(rank - 2, 3);
                let (m, k, n) = (1 + rng.below(9), 1 + rng.below(9), 1 + rng.below(9));
                let ad = [batch.clone(), vec![m, k]].concat();
                let bd = [batch.clone(), vec![k, n]].concat();
                let x = rounded(dtype, &rng.values(dtype, numel(&ad)));
                let y = rounded(dtype, &rng.values(dtype, numel(&bd)));
                let (a, b) = (tensor(dtype, &ad, &x), tensor(dtype, &bd, &y));
                let out = run_op(vec![("a", a), ("b", b)], |g, v| g.matmul(v[0], v[1]));
                let (dst, want) = naive_matmul(&ad, &x, &bd, &y, false);
                let (_, scale) = naive_matmul(&ad, &x, &bd, &y, true);
                assert_close(
                    &out,
                    &dst,
                    &want,
                    &scale,
                    float_tol(dtype) * 4.0,
                    &format!("matmul {ad:?} x {bd:?} {dtype}"),
                );
            }
        }
    }
}

#[test]
fn matmul_of_a_large_product_matches_naive() {
    let mut rng = Rng(14);
    let (ad, bd) = ([2, 65, 130], [2, 130, 70]);
    let x = rounded(DType::F32, &rng.values(DType::F32, numel(&ad)));
    let y = rounded(DType::F32, &rng.values(DType::F32, numel(&bd)));
    let (a, b) = (tensor(DType::F32, &ad, &x), tensor(DType::F32, &bd, &y));
    let out = run_op(vec![("a", a), ("b", b)], |g, v| g.matmul(v[0], v[1]));
    let (dst, want) = naive_matmul(&ad, &x, &bd, &y, false);
    let (_, scale) = naive_matmul(&ad, &x, &bd, &y, true);
    assert_close(&out, &dst, &want, &scale, 1e-5, "matmul 65x130x70");
}

// ---------------------------------------------------------------------------------------------
// Gather and scatter-add.

#[test]
fn gather_picks_rows_by_i32_and_i64_ids() {
    let mut rng = Rng(15);
    for id_dtype in [DType::I32, DType::I64] {
        for dtype in [DType::F32, DType::F64, DType::I64] {
            for (table, ids) in [
                (vec![5, 3], vec![4]),
                (vec![7], vec![2, 3]),
                (vec![4, 2, 3], vec![3, 2]),
                (vec![6, 4], vec![]),
            ] {
                let rows = table[0];
                let t = rounded(dtype, &rng.values(dtype, numel(&table)));
                let id: Vec<f64> = (0..numel(&ids)).map(|_| rng.below(rows) as f64).collect();
                let leaves = vec![
                    ("t", tensor(dtype, &table, &t)),
                    ("ids", tensor(id_dtype, &ids, &id)),
                ];
                let out = run_op(leaves, |g, v| g.gather(v[0], v[1]));
                let dst = [ids.clone(), table[1..].to_vec()].concat();
                let want: Vec<f64> = indices(&dst)
                    .iter()
                    .map(|i| {
                        let row = id[flat(&i[..ids.len()], &ids)] as usize;
                        t[flat(&[&[row][..], &i[ids.len()..]].concat(), &table)]
                    })
                    .collect();
                assert_exact(
                    &out,
                    &dst,
                    &want,
                    &format!("gather {table:?} by {ids:?} {id_dtype}"),
                );
            }
        }
    }
}

#[test]
fn scatter_add_sums_rows_at_i32_and_i64_ids() {
    let mut rng = Rng(16);
    for id_dtype in [DType::I32, DType::I64] {
        for dtype in NUMERIC {
            for (ids, row, rows) in [
                (vec![6], vec![3], 4),
                (vec![2, 5], vec![], 3),
                (vec![3, 2], vec![2, 2], 5),
            ] {
                let vals_dims = [ids.clone(), row.clone()].concat();
                let v = rounded(dtype, &rng.values(dtype, numel(&vals_dims)));
                // Repeated ids on purpose: their rows must add up.
                let id: Vec<f64> = (0..numel(&ids)).map(|_| rng.below(rows) as f64).collect();
                let leaves = vec![
                    ("ids", tensor(id_dtype, &ids, &id)),
                    ("v", tensor(dtype, &vals_dims, &v)),
                ];
                let out = run_op(leaves, |g, x| g.scatter_add(x[0], x[1], rows));
                let dst = [vec![rows], row.clone()].concat();
                let mut want = vec![0.0; numel(&dst)];
                for i in indices(&vals_dims) {
                    let target = id[flat(&i[..ids.len()], &ids)] as usize;
                    want[flat(&[&[target][..], &i[ids.len()..]].concat(), &dst)] +=
                        v[flat(&i, &vals_dims)];
                }
                let want = rounded(dtype, &want);
                if dtype == DType::F32 {
                    let scale: Vec<f64> = vec![20.0; want.len()];
                    assert_close(
                        &out,
                        &dst,
                        &want,
                        &scale,
                        1e-6,
                        &format!("scatter_add {ids:?} {dtype}"),
                    );
                } else {
                    assert_exact(
                        &out,
                        &dst,
                        &want,
                        &format!("scatter_add {ids:?} {dtype} {id_dtype}"),
                    );
                }
            }
        }
    }
}

fn id_graph(op: &str, id_dtype: DType) -> Graph {
    let mut g = Graph::new();
    if op == "gather" {
        let t = g.input("t", [4, 2], DType::F32).unwrap();
        let ids = g.input("ids", [3], id_dtype).unwrap();
        let r = g.gather(t, ids).unwrap();
        g.set_output("y", r).unwrap();
    } else {
        let ids = g.input("ids", [3], id_dtype).unwrap();
        let v = g.input("t", [3, 2], DType::F32).unwrap();
        let r = g.scatter_add(ids, v, 4).unwrap();
        g.set_output("y", r).unwrap();
    }
    g
}

#[test]
fn out_of_range_ids_are_errors_naming_the_id_and_the_rows() {
    for op in ["gather", "scatter_add"] {
        for id_dtype in [DType::I32, DType::I64] {
            for bad in [4.0, -1.0, 1e9] {
                let g = id_graph(op, id_dtype);
                let table = if op == "gather" {
                    tensor(DType::F32, &[4, 2], &[1.0; 8])
                } else {
                    tensor(DType::F32, &[3, 2], &[1.0; 6])
                };
                let leaves: IndexMap<String, Tensor> = [
                    ("t".to_string(), table),
                    ("ids".to_string(), tensor(id_dtype, &[3], &[0.0, bad, 2.0])),
                ]
                .into_iter()
                .collect();
                let err = run_graph(&g, &leaves).unwrap_err();
                assert_eq!(
                    err.root(),
                    &ExecError::IdOutOfRange {
                        op: if op == "gather" {
                            "gather"
                        } else {
                            "scatter_add"
                        },
                        id: bad as i64,
                        position: 1,
                        rows: 4
                    }
                );
                let msg = err.to_string();
                assert!(
                    msg.contains(&format!("id {}", bad as i64)) && msg.contains("4 rows"),
                    "{msg}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// exec_node on its own: bad buffers are errors, not panics.

#[test]
fn exec_node_rejects_buffers_that_do_not_match_their_types() {
    let mut g = Graph::new();
    let a = g.input("a", [2, 3], DType::F32).unwrap();
    let b = g.input("b", [2, 3], DType::F32).unwrap();
    let s = g.add(a, b).unwrap();
    let node: &Node = g.node(s);
    let t = TensorType::new([2, 3], DType::F32);
    let x = vec![1.0f32; 6];
    let short = vec![1.0f32; 5];
    let mut out = Tensor::zeros(t.clone());
    // The add's two operands, as `views`, refused: the error.
    let mut refused = |views: &[View]| {
        let types = vec![&t; views.len()];
        exec_node(node, views, &types, out.view_mut()).unwrap_err()
    };

    // An operand refused: which, and what its buffer held (dtype and length).
    let operand = |err: ExecError| match err {
        ExecError::Operand {
            index,
            got_dtype,
            got_len,
            ..
        } => (index, got_dtype, got_len),
        other => panic!("not an operand's error: {other}"),
    };
    let ints = vec![1i32; 6];
    let short_one = refused(&[View::F32(&x), View::F32(&short)]);
    assert_eq!(operand(short_one), (1, DType::F32, 5));
    let int_one = refused(&[View::F32(&x), View::I32(&ints)]);
    assert_eq!(operand(int_one), (1, DType::I32, 6));
    let err = refused(&[View::F32(&x)]);
    assert!(err.to_string().contains("2 operands"), "{err}");
    let mut wrong_out = Tensor::zeros(TensorType::new([6], DType::F64));
    let err = exec_node(
        node,
        &[View::F32(&x), View::F32(&x)],
        &[&t, &t],
        wrong_out.view_mut(),
    )
    .unwrap_err();
    assert!(matches!(err, ExecError::Output { .. }), "{err}");
    let leaf = g.node(a);
    let err = exec_node(leaf, &[], &[], out.view_mut()).unwrap_err();
    assert!(err.to_string().contains("leaves are not executed"), "{err}");

    exec_node(
        node,
        &[View::F32(&x), View::F32(&x)],
        &[&t, &t],
        out.view_mut(),
    )
    .unwrap();
    assert_eq!(out.as_f32().unwrap(), &[2.0; 6]);
}

// ---------------------------------------------------------------------------------------------
// The interpreter.

#[test]
fn a_missing_leaf_value_is_an_error_naming_the_leaf_and_its_type() {
    let mut g = Graph::new();
    let w = g.parameter("w", [3], DType::F32, Init::Zeros).unwrap();
    let x = g.input("x", [3], DType::F32).unwrap();
    let y = g.mul(w, x).unwrap();
    g.set_output("y", y).unwrap();
    let leaves: IndexMap<String, Tensor> = [("x".to_string(), Tensor::from_f32([3], vec![1.0; 3]))]
        .into_iter()
        .collect();
    let err = run_graph(&g, &leaves).unwrap_err();
    assert_eq!(
        err,
        ExecError::MissingLeaf {
            kind: LeafKind::Parameter,
            name: "w".into(),
            expected: TensorType::new([3], DType::F32)
        }
    );
    assert!(
        err.to_string().contains("\"w\"") && err.to_string().contains("f32[3]"),
        "{err}"
    );
}

#[test]
fn a_mistyped_leaf_value_is_an_error_naming_both_types() {
    let mut g = Graph::new();
    let x = g.input("x", [2, 3], DType::F32).unwrap();
    let y = g.exp(x).unwrap();
    g.set_output("y", y).unwrap();
    for bad in [
        Tensor::from_f32([3, 2], vec![0.0; 6]),
        Tensor::from_f64([2, 3], vec![0.0; 6]),
    ] {
        let got = bad.ty.clone();
        let leaves: IndexMap<String, Tensor> = [("x".to_string(), bad)].into_iter().collect();
        let err = run_graph(&g, &leaves).unwrap_err();
        assert_eq!(
            err,
            ExecError::LeafType {
                kind: LeafKind::Input,
                name: "x".into(),
                expected: TensorType::new([2, 3], DType::F32),
                got: got.clone()
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("f32[2,3]") && msg.contains(&got.to_string()),
            "{msg}"
        );
    }
}

#[test]
fn updates_come_back_by_leaf_name_and_dead_leaves_need_no_value() {
    let mut g = Graph::new();
    let w = g.parameter("w", [2], DType::F64, Init::Zeros).unwrap();
    let unused = g.parameter("unused", [2], DType::F64, Init::Zeros).unwrap();
    let x = g.input("x", [2], DType::F64).unwrap();
    let dead = g.exp(unused).unwrap();
    let _ = dead;
    let w2 = g.add(w, x).unwrap();
    let loss = g.sum_all(w2).unwrap();
    g.set_output("loss", loss).unwrap();
    g.set_output("w2", w2).unwrap();
    g.set_update(w, w2).unwrap();
    let mut leaves: IndexMap<String, Tensor> = [
        ("w".to_string(), Tensor::from_f64([2], vec![1.0, 2.0])),
        ("x".to_string(), Tensor::from_f64([2], vec![10.0, 20.0])),
    ]
    .into_iter()
    .collect();
    let mut v = run_graph(&g, &leaves).unwrap();
    assert_eq!(v.outputs["loss"].scalar_f64(), Some(33.0));
    assert_eq!(v.outputs["w2"].as_f64().unwrap(), &[11.0, 22.0]);
    assert_eq!(v.updates.keys().collect::<Vec<_>>(), vec!["w"]);
    assert_eq!(v.updates["w"].as_f64().unwrap(), &[11.0, 22.0]);
    v.apply_updates(&mut leaves);
    let v = run_graph(&g, &leaves).unwrap();
    assert_eq!(v.outputs["loss"].scalar_f64(), Some(63.0));
}

#[test]
fn an_error_inside_a_graph_names_the_node_and_op() {
    let g = id_graph("gather", DType::I64);
    let leaves: IndexMap<String, Tensor> = [
        ("t".to_string(), Tensor::from_f32([4, 2], vec![0.0; 8])),
        ("ids".to_string(), Tensor::from_i64([3], vec![0, 1, 9])),
    ]
    .into_iter()
    .collect();
    let err = run_graph(&g, &leaves).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("node %2 (gather): gather: id 9 at position 2"),
        "{msg}"
    );
}

// ---------------------------------------------------------------------------------------------
// exec_node allocates nothing (the planned executor runs it on one preallocated slab).

/// The tests' per-thread counting allocator (testkit/src/counting.rs), this binary's.
#[global_allocator]
static COUNTING: counting::Counting = counting::Counting;

#[test]
fn exec_node_allocates_nothing_for_every_op_but_matmul() {
    let mut rng = Rng(17);
    let mut g = Graph::new();
    let x = g.input("x", [2, 3, 4, 5], DType::F32).unwrap();
    let row = g.input("row", [5], DType::F32).unwrap();
    let col = g.input("col", [2, 3, 4, 1], DType::F32).unwrap();
    let ids = g.input("ids", [2, 3], DType::I32).unwrap();
    let table = g
        .parameter("table", [7, 5], DType::F32, Init::Zeros)
        .unwrap();
    let mut outs = vec![];
    let a = g.add(x, row).unwrap();
    let b = g.mul(a, col).unwrap();
    let c = g.add_scalar(b, 2.0).unwrap();
    outs.extend([a, b, c]);
    for &u in UnaryOp::ALL.iter().filter(|&&u| u != UnaryOp::Erf) {
        outs.push(g.unary(u, c).unwrap());
    }
    for bo in [BinaryOp::Sub, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min] {
        outs.push(g.binary(bo, c, x).unwrap());
    }
    let m = g.compare(CmpOp::Gt, c, x).unwrap();
    outs.push(g.select(m, c, x).unwrap());
    outs.push(g.transpose(c, &[3, 1, 0, 2]).unwrap());
    outs.push(g.transpose(c, &[0, 1, 3, 2]).unwrap());
    outs.push(g.slice(c, 2, 1, 3).unwrap());
    let s1 = g.slice(c, 3, 0, 2).unwrap();
    outs.push(g.concat(&[c, s1], 3).unwrap());
    outs.push(g.sum(c, &[3]).unwrap());
    outs.push(g.sum(c, &[0, 2]).unwrap());
    outs.push(g.max(c, &[1, 3]).unwrap());
    outs.push(g.reshape(c, [6, 20]).unwrap());
    outs.push(g.convert(c, DType::I64).unwrap());
    outs.push(g.iota([3, 4], 1, DType::I32).unwrap());
    let gathered = g.gather(table, ids).unwrap();
    outs.push(gathered);
    outs.push(g.scatter_add(ids, gathered, 7).unwrap());
    for (i, o) in outs.iter().enumerate() {
        g.set_output(&format!("o{i}"), *o).unwrap();
    }

    let mut leaves: IndexMap<String, Tensor> = IndexMap::new();
    for (name, dims) in [
        ("x", vec![2, 3, 4, 5]),
        ("row", vec![5]),
        ("col", vec![2, 3, 4, 1]),
        ("table", vec![7, 5]),
    ] {
        let v: Vec<f64> = rng
            .values(DType::F32, numel(&dims))
            .iter()
            .map(|v| v.abs() + 0.1)
            .collect();
        leaves.insert(name.to_string(), tensor(DType::F32, &dims, &v));
    }
    leaves.insert(
        "ids".to_string(),
        tensor(DType::I32, &[2, 3], &[0.0, 6.0, 3.0, 3.0, 1.0, 5.0]),
    );
    let reference = run_graph(&g, &leaves).unwrap().outputs;

    // Every node again, each into a preallocated output, counting allocations around the call.
    let probe = allocations(|| drop(std::hint::black_box(vec![0u8; 16])));
    assert!(probe > 0, "the counter must see allocations");
    let mut values: Vec<Option<Tensor>> = vec![None; g.len()];
    for id in g.ids() {
        let node = g.node(id);
        if let Op::Leaf { name, .. } = &node.op {
            values[id.index()] = Some(leaves[name.as_str()].clone());
            continue;
        }
        let mut out = Tensor::zeros(node.ty.clone());
        let views: Vec<View> = node
            .inputs
            .iter()
            .map(|i| values[i.index()].as_ref().unwrap().view())
            .collect();
        let types: Vec<&TensorType> = node.inputs.iter().map(|&i| g.ty(i)).collect();
        let made = allocations(|| exec_node(node, &views, &types, out.view_mut()).unwrap());
        assert_eq!(
            made,
            0,
            "{} ({} from {types:?}) allocated {made} times",
            node.op.name(),
            node.ty
        );
        values[id.index()] = Some(out);
    }
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(
            values[o.index()].as_ref().unwrap(),
            &reference[&format!("o{i}")]
        );
    }
}

#[test]
fn matmul_allocates_only_the_packing_buffer_once_per_product() {
    let mut g = Graph::new();
    let a = g.input("a", [3, 40, 50], DType::F32).unwrap();
    let b = g.input("b", [3, 50, 60], DType::F32).unwrap();
    let c = g.matmul(a, b).unwrap();
    let (x, y) = (vec![0.5f32; 3 * 40 * 50], vec![0.25f32; 3 * 50 * 60]);
    let mut out = Tensor::zeros(g.ty(c).clone());
    let (ta, tb) = (g.ty(a).clone(), g.ty(b).clone());
    let made = allocations(|| {
        exec_node(
            g.node(c),
            &[View::F32(&x), View::F32(&y)],
            &[&ta, &tb],
            out.view_mut(),
        )
        .unwrap()
    });
    assert!(made <= 3, "a batch of 3 products allocated {made} times");
    assert!(out.as_f32().unwrap().iter().all(|&v| v == 50.0 * 0.125));
}

#[test]
fn exec_node_rejects_nodes_whose_shapes_disagree_with_their_operands() {
    let t = |d: &[usize]| TensorType::new(Shape::new(d), DType::F32);
    let node = |op: Op, n: usize, ty: TensorType| Node {
        op,
        inputs: (0..n as u32).map(NodeId).collect(),
        ty,
    };
    let x = vec![1.0f32; 12];
    let cases = [
        (node(Op::Reshape, 1, t(&[13])), t(&[12])),
        (node(Op::Broadcast, 1, t(&[12, 5])), t(&[3, 4])),
        (
            node(
                Op::Transpose {
                    perm: [0, 0].into_iter().collect(),
                },
                1,
                t(&[4, 3]),
            ),
            t(&[3, 4]),
        ),
        (
            node(
                Op::Slice {
                    axis: 1,
                    start: 2,
                    end: 5,
                },
                1,
                t(&[3, 3]),
            ),
            t(&[3, 4]),
        ),
        (
            node(
                Op::Reduce {
                    op: ingot_compiler::ir::ReduceOp::Sum,
                    axes: [2].into_iter().collect(),
                },
                1,
                t(&[3, 1]),
            ),
            t(&[3, 4]),
        ),
        (node(Op::Unary(UnaryOp::Exp), 1, t(&[4, 3])), t(&[3, 4])),
    ];
    for (n, in_ty) in cases {
        let mut out = Tensor::zeros(n.ty.clone());
        let err = exec_node(&n, &[View::F32(&x)], &[&in_ty], out.view_mut()).unwrap_err();
        assert!(
            matches!(err, ExecError::Invalid { .. }),
            "{}: {err}",
            n.op.name()
        );
    }
}

#[test]
fn a_scatter_add_of_bf16_rows_stated_f32_keeps_its_sums_unrounded() {
    // A data-parallel step sums the embedding's rows, gathered in bf16, straight into its f32
    // gradient: each sum is made in f32 in position order and kept, not rounded to bf16.
    let mut g = Graph::new();
    let ids = g.input("ids", [5], DType::I64).unwrap();
    let v = g.input("v", [5, 2], DType::BF16).unwrap();
    let wide = TensorType::new(Shape::from([4, 2]), DType::F32);
    let r = g
        .push(Op::ScatterAdd { rows: 4 }, &[ids, v], Some(wide))
        .unwrap();
    assert_eq!(g.ty(r).dtype, DType::F32);
    g.set_output("y", r).unwrap();
    // Row 0's second sum, -1.75 + 2^-8, is no bf16 (its ulp there is 2^-7): rounded once to
    // bf16 it would read -1.75 or -1.7421875.
    let step = 1.0 / 256.0;
    let leaves: IndexMap<String, Tensor> = [
        (
            "ids".to_string(),
            tensor(DType::I64, &[5], &[0.0, 2.0, 0.0, 3.0, 0.0]),
        ),
        (
            "v".to_string(),
            tensor(
                DType::BF16,
                &[5, 2],
                &[1.0, -2.0, 5.0, 0.5, step, step, 7.0, 1.0, step, 0.25],
            ),
        ),
    ]
    .into_iter()
    .collect();
    let out = run_graph(&g, &leaves).unwrap();
    let want = [
        1.0 + 2.0 * step,
        -2.0 + step + 0.25,
        0.0,
        0.0,
        5.0,
        0.5,
        7.0,
        1.0,
    ];
    assert_eq!(out.outputs["y"].as_f32().unwrap(), &want.map(|x| x as f32));
    // Stated any other way than the values' type or f32 over bf16, it is refused.
    let mut g = Graph::new();
    let ids = g.input("ids", [5], DType::I64).unwrap();
    let v = g.input("v", [5, 2], DType::F32).unwrap();
    let err = g
        .push(
            Op::ScatterAdd { rows: 4 },
            &[ids, v],
            Some(TensorType::new(Shape::from([4, 2]), DType::BF16)),
        )
        .unwrap_err();
    assert!(err.to_string().contains("stated result"), "{err}");
}
