//! Finite-difference checks, in f64, of every primitive's VJP and of every nn layer: autodiff's
//! gradient of `loss = sum(f(params) * w)` (with a random `w`, so every output element matters)
//! must match central differences of the same loss evaluated by the reference interpreter.

use indexmap::IndexMap;
use ingot_compiler::autodiff::grad;
use ingot_compiler::ir::{BinaryOp, CmpOp, DType, Graph, Init, Shape};
use ingot_compiler::trace::nn;
use ingot_ir_tests::gradcheck::{arg, check, positive};
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::tensor::Tensor;

fn ids(shape: &[usize], values: &[i64]) -> Tensor {
    Tensor::from_i64(Shape::new(shape), values.to_vec())
}

#[test]
fn unary_vjps_match_finite_differences() {
    check("neg", &[arg(&[3, 4])], vec![], |g, p| g.neg(p[0]));
    check("exp", &[arg(&[3, 4])], vec![], |g, p| g.exp(p[0]));
    check("log", &[positive(&[3, 4])], vec![], |g, p| g.log(p[0]));
    check("sqrt", &[positive(&[3, 4])], vec![], |g, p| g.sqrt(p[0]));
    check("tanh", &[arg(&[3, 4])], vec![], |g, p| g.tanh(p[0]));
    check("recip", &[positive(&[3, 4])], vec![], |g, p| g.recip(p[0]));
}

#[test]
fn binary_vjps_match_finite_differences() {
    // Each op through the builder's `binary` (what `add`, `maximum` and the rest call); a
    // divisor stays away from zero.
    for (name, op, dims) in [
        ("add", BinaryOp::Add, [2, 3]),
        ("sub", BinaryOp::Sub, [2, 3]),
        ("mul", BinaryOp::Mul, [2, 3]),
        ("div", BinaryOp::Div, [2, 3]),
        ("max", BinaryOp::Max, [4, 5]),
        ("min", BinaryOp::Min, [4, 5]),
    ] {
        let rhs = if op == BinaryOp::Div { positive } else { arg };
        check(name, &[arg(&dims), rhs(&dims)], vec![], |g, p| {
            g.binary(op, p[0], p[1])
        });
    }
    // The same operand twice: contributions from both slots add up.
    check("mul self", &[arg(&[5])], vec![], |g, p| g.mul(p[0], p[0]));
}

#[test]
fn compare_and_select_vjps_match_finite_differences() {
    check(
        "select",
        &[arg(&[3, 4]), arg(&[3, 4]), arg(&[3, 4])],
        vec![],
        |g, p| {
            let c = g.compare(CmpOp::Gt, p[2], p[0])?;
            g.select(c, p[0], p[1])
        },
    );
}

#[test]
fn shape_op_vjps_match_finite_differences() {
    check("broadcast", &[arg(&[3, 1])], vec![], |g, p| {
        g.broadcast_to(p[0], [2, 3, 4])
    });
    check("broadcast scalar", &[arg(&[])], vec![], |g, p| {
        g.broadcast_to(p[0], [2, 3])
    });
    check("reshape", &[arg(&[2, 6])], vec![], |g, p| {
        g.reshape(p[0], [3, 4])
    });
    check("transpose", &[arg(&[2, 3, 4])], vec![], |g, p| {
        g.transpose(p[0], &[2, 0, 1])
    });
    check("slice", &[arg(&[4, 5])], vec![], |g, p| {
        g.slice(p[0], 1, 1, 3)
    });
    check("slice to end", &[arg(&[4, 5])], vec![], |g, p| {
        g.slice(p[0], 0, 2, 4)
    });
    check("concat", &[arg(&[2, 3]), arg(&[2, 2])], vec![], |g, p| {
        g.concat(&[p[0], p[1]], 1)
    });
}

/// A value read through several slices (overlapping, along two axes) and directly gets its
/// gradient joined by segment (autodiff's `slices`): it must still be the sum of every reader's.
#[test]
fn a_value_read_through_overlapping_slices_gets_every_readers_gradient() {
    // A linear resize's neighbours: `x` shifted by one either way along axis 1, edges repeated.
    check("shifted neighbours", &[arg(&[3, 5])], vec![], |g, p| {
        let x = p[0];
        let tail = g.slice(x, 1, 1, 5)?;
        let last = g.slice(x, 1, 4, 5)?;
        let head = g.slice(x, 1, 0, 4)?;
        let first = g.slice(x, 1, 0, 1)?;
        let next = g.concat(&[tail, last], 1)?;
        let prev = g.concat(&[first, head], 1)?;
        let a = g.mul_scalar(x, 0.75)?;
        let b = g.mul_scalar(next, 0.25)?;
        let c = g.mul(prev, x)?;
        let ab = g.add(a, b)?;
        g.add(ab, c)
    });
    // Slices along two axes, one covering all of its axis.
    check("slices along two axes", &[arg(&[4, 6])], vec![], |g, p| {
        let x = p[0];
        let rows = g.slice(x, 0, 1, 3)?;
        let cols = g.slice(x, 1, 2, 5)?;
        let all = g.slice(x, 1, 0, 6)?;
        let rr = g.mul(rows, rows)?;
        let r = g.sum(rr, &[0, 1])?;
        let c = g.sum(cols, &[0, 1])?;
        let aa = g.mul(all, all)?;
        let a = g.sum(aa, &[0, 1])?;
        let rc = g.add(r, c)?;
        g.add(rc, a)
    });
}

#[test]
fn reduction_vjps_match_finite_differences() {
    check("sum last", &[arg(&[3, 4])], vec![], |g, p| {
        g.sum(p[0], &[1])
    });
    check("sum many", &[arg(&[2, 3, 4])], vec![], |g, p| {
        g.sum(p[0], &[0, 2])
    });
    check("max last", &[arg(&[3, 5])], vec![], |g, p| {
        g.max(p[0], &[1])
    });
    check("max first", &[arg(&[4, 3])], vec![], |g, p| {
        g.max(p[0], &[0])
    });
}

#[test]
fn matmul_vjp_matches_finite_differences() {
    check("matmul", &[arg(&[3, 4]), arg(&[4, 2])], vec![], |g, p| {
        g.matmul(p[0], p[1])
    });
    check(
        "batched matmul",
        &[arg(&[2, 3, 4]), arg(&[2, 4, 5])],
        vec![],
        |g, p| g.matmul(p[0], p[1]),
    );
}

#[test]
fn gather_and_scatter_add_vjps_match_finite_differences() {
    let rows = vec![("ids", ids(&[2, 3], &[0, 4, 2, 2, 1, 4]))];
    check("gather", &[arg(&[5, 3])], rows, |g, p| {
        let i = g.leaf("ids").unwrap();
        g.gather(p[0], i)
    });
    let rows = vec![("ids", ids(&[4], &[1, 0, 1, 3]))];
    check("scatter_add", &[arg(&[4, 2])], rows, |g, p| {
        let i = g.leaf("ids").unwrap();
        g.scatter_add(i, p[0], 5)
    });
}

#[test]
fn nn_layer_gradients_match_finite_differences() {
    check("linear", &[arg(&[2, 3, 4])], vec![], |g, p| {
        nn::linear(g, "fc", p[0], 4, 5, true)
    });
    check("layer_norm", &[arg(&[3, 6])], vec![], |g, p| {
        nn::layer_norm(g, "ln", p[0], 1e-5)
    });
    check("gelu_tanh", &[arg(&[4, 5])], vec![], |g, p| {
        nn::gelu_tanh(g, p[0])
    });
    check("relu", &[arg(&[4, 5])], vec![], |g, p| nn::relu(g, p[0]));
    check("softmax", &[arg(&[3, 5])], vec![], |g, p| {
        nn::softmax(g, p[0])
    });
    check("log_softmax", &[arg(&[3, 5])], vec![], |g, p| {
        nn::log_softmax(g, p[0])
    });
    check("attention", &[arg(&[2, 4, 8])], vec![], |g, p| {
        nn::causal_self_attention(g, "attn", p[0], 2)
    });
    let targets = vec![("y", ids(&[4], &[0, 3, 2, 3]))];
    check("cross_entropy", &[arg(&[4, 5])], targets, |g, p| {
        let y = g.leaf("y").unwrap();
        nn::softmax_cross_entropy(g, p[0], y)
    });
}

#[test]
fn embedding_table_gradient_matches_finite_differences() {
    let tokens = vec![("tok", ids(&[2, 3], &[1, 0, 5, 5, 2, 3]))];
    check("embedding", &[arg(&[1])], tokens, |g, p| {
        let t = g.leaf("tok").unwrap();
        let e = nn::embedding(g, "wte", t, 6, 4, DType::F64)?;
        g.mul(e, p[0])
    });
}

/// A round trip through f32 rounds away finite differences' small steps, so convert's VJP is
/// checked exactly instead: the gradient of `sum(f64(f32(p)) * w)` is `w`, rounded to f32.
#[test]
fn convert_passes_the_gradient_through_in_the_operand_dtype() {
    let mut g = Graph::new();
    let p = g.parameter("p", [3], DType::F64, Init::Zeros).unwrap();
    let w = g.input("w", [3], DType::F64).unwrap();
    let f = g.convert(p, DType::F32).unwrap();
    let back = g.convert(f, DType::F64).unwrap();
    let yw = g.mul(back, w).unwrap();
    let loss = g.sum_all(yw).unwrap();
    let gp = grad(&mut g, loss, &[p]).unwrap()[0];
    g.set_output("g", gp).unwrap();
    let wv = vec![0.1, -2.5, 1.0 / 3.0];
    let leaves: IndexMap<String, Tensor> = [
        (
            "p".to_string(),
            Tensor::from_f64(Shape::new(&[3]), vec![1.0, 2.0, 3.0]),
        ),
        (
            "w".to_string(),
            Tensor::from_f64(Shape::new(&[3]), wv.clone()),
        ),
    ]
    .into_iter()
    .collect();
    let out = run_graph(&g, &leaves).unwrap();
    let expected: Vec<f64> = wv.iter().map(|&x| x as f32 as f64).collect();
    assert_eq!(out.outputs["g"].as_f64().unwrap(), &expected[..]);
}
