//! The unfused CPU executor on bf16: each op is its f32 op on the widened values, rounded to
//! the nearest bf16 once, on store; sums and matrix products accumulate in f32.

use indexmap::IndexMap;
use ingot_compiler::ir::{BinaryOp, DType, Graph, Shape, UnaryOp};
use ingot_runtime::cpu::run_graph;
use ingot_runtime::tensor::{bf16, Tensor};

fn run(g: &Graph, leaves: &[(&str, Tensor)]) -> IndexMap<String, Tensor> {
    let leaves: IndexMap<String, Tensor> = leaves
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    run_graph(g, &leaves).unwrap().outputs
}

/// bf16 values of every kind: ordinary, tiny, huge, ties' neighbours, zeros, infinities, NaN.
fn samples(n: usize, seed: u32) -> Vec<bf16> {
    let mut s = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            match i % 16 {
                0 => bf16::from_bits(s as u16),
                1 => bf16::ZERO,
                2 => bf16::NEG_ZERO,
                _ => bf16::from_f32(((s % 20001) as f32 - 10000.0) / 997.0),
            }
        })
        .collect()
}

fn same_bits(got: &[bf16], want: &[bf16], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(
            ok,
            "{what} element {i}: got {g} ({:04x}), want {w} ({:04x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

#[test]
fn bf16_elementwise_ops_are_the_f32_op_rounded_once() {
    let n = 512;
    let (a, b) = (samples(n, 1), samples(n, 2));
    for &u in UnaryOp::ALL {
        let mut g = Graph::new();
        let x = g.input("a", [n], DType::BF16).unwrap();
        let y = g.unary(u, x).unwrap();
        g.set_output("y", y).unwrap();
        let out = run(&g, &[("a", Tensor::from_vec([n], a.clone()))]);
        let f = |x: f32| match u {
            UnaryOp::Neg => -x,
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Tanh => ingot_kernels::cpu::Float::tanh(x),
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Erf => ingot_kernels::cpu::Float::erf(x),
        };
        let want: Vec<bf16> = a.iter().map(|x| bf16::from_f32(f(x.to_f32()))).collect();
        same_bits(out["y"].as_bf16().unwrap(), &want, &format!("{u:?}"));
    }
    for &op in BinaryOp::ALL {
        let mut g = Graph::new();
        let x = g.input("a", [n], DType::BF16).unwrap();
        let y = g.input("b", [n], DType::BF16).unwrap();
        let z = g.binary(op, x, y).unwrap();
        g.set_output("z", z).unwrap();
        let out = run(
            &g,
            &[
                ("a", Tensor::from_vec([n], a.clone())),
                ("b", Tensor::from_vec([n], b.clone())),
            ],
        );
        let f = |x: f32, y: f32| match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Max | BinaryOp::Min if x.is_nan() || y.is_nan() => f32::NAN,
            BinaryOp::Max => x.max(y),
            BinaryOp::Min => x.min(y),
        };
        let want: Vec<bf16> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| bf16::from_f32(f(x.to_f32(), y.to_f32())))
            .collect();
        same_bits(out["z"].as_bf16().unwrap(), &want, &format!("{op:?}"));
    }
}

/// A bf16 accumulator stops growing at 256 when adding ones (257 is not a bf16): an f32 one
/// reaches 4096 exactly.
#[test]
fn bf16_sums_and_matmuls_accumulate_in_f32() {
    let k = 4096;
    let ones = Tensor::from_vec([1, k], vec![bf16::ONE; k]);
    let mut g = Graph::new();
    let x = g.input("x", [1, k], DType::BF16).unwrap();
    let s = g.sum(x, &[1]).unwrap();
    let xt = g.transpose(x, &[1, 0]).unwrap();
    let p = g.matmul(x, xt).unwrap();
    assert_eq!(g.ty(p).dtype, DType::BF16);
    g.set_output("s", s).unwrap();
    g.set_output("p", p).unwrap();
    let out = run(&g, &[("x", ones)]);
    assert_eq!(out["s"].to_f64_vec(), vec![4096.0]);
    assert_eq!(out["p"].to_f64_vec(), vec![4096.0]);
}

#[test]
fn a_bf16_matmul_is_the_exact_product_rounded_once_up_to_f32_accumulation() {
    let (m, k, n) = (7, 33, 5);
    // Samples with the infinities, NaNs and huge values made 1.
    let tame = |n: usize, seed: u32| -> Vec<bf16> {
        samples(n, seed)
            .into_iter()
            .map(|x| {
                if x.is_finite() && x.to_f32().abs() < 100.0 {
                    x
                } else {
                    bf16::ONE
                }
            })
            .collect()
    };
    let (a, b) = (tame(m * k, 3), tame(k * n, 4));
    let mut g = Graph::new();
    let x = g.input("a", [m, k], DType::BF16).unwrap();
    let y = g.input("b", [k, n], DType::BF16).unwrap();
    let p = g.matmul(x, y).unwrap();
    g.set_output("p", p).unwrap();
    let out = run(
        &g,
        &[
            ("a", Tensor::from_vec([m, k], a.clone())),
            ("b", Tensor::from_vec([k, n], b.clone())),
        ],
    );
    let got = out["p"].as_bf16().unwrap();
    for i in 0..m {
        for j in 0..n {
            let exact: f64 = (0..k)
                .map(|p| a[i * k + p].to_f64() * b[p * n + j].to_f64())
                .sum();
            let g = got[i * n + j].to_f64();
            // One bf16 rounding (2^-9 relative) plus f32 accumulation error (far smaller).
            let tol = exact.abs() * 2f64.powi(-8) + 1e-3;
            assert!(
                (g - exact).abs() <= tol,
                "[{i},{j}]: got {g}, exact {exact}"
            );
        }
    }
    assert_eq!(out["p"].ty.shape, Shape::new(&[m, n]));
}

#[test]
fn converting_to_and_from_bf16_rounds_to_nearest_even_and_truncates_to_integers() {
    // f32 ties: 1 + 2^-8 goes down to 1 (even), 1 + 3 * 2^-8 up to 1 + 2^-6.
    let xs = vec![
        1.0f32 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        -2.5,
        f32::MAX,
        f32::NAN,
    ];
    let mut g = Graph::new();
    let x = g.input("x", [5], DType::F32).unwrap();
    let b = g.cast(x, DType::BF16).unwrap();
    let i = g.cast(b, DType::I32).unwrap();
    let back = g.cast(b, DType::F64).unwrap();
    g.set_output("b", b).unwrap();
    g.set_output("i", i).unwrap();
    g.set_output("back", back).unwrap();
    let out = run(&g, &[("x", Tensor::from_f32([5], xs))]);
    let v = out["back"].to_f64_vec();
    assert_eq!(v[0], 1.0);
    assert_eq!(v[1], 1.0 + 2f64.powi(-6));
    assert_eq!(v[2], -2.5);
    assert_eq!(v[3], f64::INFINITY, "past bf16's range rounds to infinity");
    assert!(v[4].is_nan());
    assert_eq!(out["i"].as_i32().unwrap(), &[1, 1, -2, i32::MAX, 0]);
}
