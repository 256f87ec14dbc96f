//! Finite-difference checks, in f64, of the convolution and pooling VJPs and of the CNN layers
//! (the same harness as gradcheck.rs): autodiff's gradient of `loss = sum(f(params) * w)` must
//! match central differences of the same loss evaluated by the reference interpreter.

use indexmap::IndexMap;
use ingot_compiler::ir::{Conv2d, DType, Graph, Pool2d, Shape};
use ingot_compiler::trace::nn;
use ingot_ir_tests::gradcheck::{arg, check};
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::tensor::Tensor;

fn conv(s: usize, p: usize, d: usize, groups: usize) -> Conv2d {
    Conv2d {
        stride: [s, s],
        padding: [p, p],
        dilation: [d, d],
        groups,
        layout: Default::default(),
    }
}

/// (x dims, w dims, stride, padding, dilation, groups): strides, padding, dilation and groups
/// each away from 1 somewhere, and a non-square kernel and image.
type ConvCase = ([usize; 4], [usize; 4], usize, usize, usize, usize);
const CONVS: [ConvCase; 4] = [
    ([2, 3, 6, 5], [4, 3, 3, 3], 1, 1, 1, 1),
    ([2, 4, 7, 6], [6, 2, 3, 2], 2, 1, 1, 2),
    ([1, 2, 8, 7], [2, 2, 2, 3], 1, 2, 2, 1),
    ([2, 4, 5, 5], [4, 1, 3, 3], 2, 0, 1, 4),
];

#[test]
fn conv2d_gradients_in_input_and_weight_match_finite_differences() {
    for (i, (x, w, s, p, d, gr)) in CONVS.into_iter().enumerate() {
        check(
            &format!("conv2d #{i}"),
            &[arg(&x), arg(&w)],
            vec![],
            |g, q| g.conv2d(q[0], q[1], conv(s, p, d, gr)),
        );
    }
}

#[test]
fn the_conv_backward_ops_have_gradients_that_match_finite_differences() {
    for (i, (x, w, s, p, d, gr)) in CONVS.into_iter().enumerate() {
        let c = conv(s, p, d, gr);
        // The output gradient's shape: a forward conv's result.
        let mut probe = Graph::new();
        let xp = probe.input("x", Shape::new(&x), DType::F64).unwrap();
        let wp = probe.input("w", Shape::new(&w), DType::F64).unwrap();
        let y = probe.conv2d(xp, wp, c).unwrap();
        let dy: Vec<usize> = probe.ty(y).shape.dims().to_vec();
        check(
            &format!("conv2d_grad_input #{i}"),
            &[arg(&dy), arg(&w)],
            vec![],
            |g, q| g.conv2d_grad_input(q[0], q[1], c, [x[2], x[3]]),
        );
        check(
            &format!("conv2d_grad_weight #{i}"),
            &[arg(&x), arg(&dy)],
            vec![],
            |g, q| g.conv2d_grad_weight(q[0], q[1], c, [w[2], w[3]]),
        );
    }
}

#[test]
fn max_pool2d_gradients_match_finite_differences() {
    for (i, (k, s, p, d)) in [(2, 2, 0, 1), (3, 2, 1, 1), (2, 1, 1, 2), (3, 3, 0, 1)]
        .into_iter()
        .enumerate()
    {
        let pool = Pool2d {
            kernel: [k, k],
            stride: [s, s],
            padding: [p, p],
            dilation: [d, d],
            layout: ingot_compiler::ir::ConvLayout::Nchw,
        };
        check(
            &format!("max_pool2d #{i}"),
            &[arg(&[2, 3, 7, 6])],
            vec![],
            |g, q| g.max_pool2d(q[0], pool),
        );
    }
}

#[test]
fn cnn_layer_gradients_match_finite_differences() {
    check(
        "nn::conv2d with bias",
        &[arg(&[2, 3, 5, 5])],
        vec![],
        |g, q| nn::conv2d(g, "conv", q[0], 3, 4, 3, 1, 1, 1, 1, true),
    );
    check("nn::avg_pool2d", &[arg(&[2, 3, 6, 5])], vec![], |g, q| {
        nn::avg_pool2d(g, q[0], 3, 2, 1)
    });
    check(
        "nn::global_avg_pool",
        &[arg(&[2, 3, 4, 5])],
        vec![],
        |g, q| nn::global_avg_pool(g, q[0]),
    );
    check("nn::batch_norm2d", &[arg(&[3, 2, 3, 4])], vec![], |g, q| {
        nn::batch_norm2d(g, "bn", q[0], 1e-5)
    });
    check(
        "conv, relu, pool, flatten",
        &[arg(&[2, 2, 6, 6])],
        vec![],
        |g, q| {
            let y = nn::conv2d(g, "c", q[0], 2, 3, 3, 1, 1, 1, 1, true)?;
            let y = nn::relu(g, y)?;
            let y = nn::max_pool2d(g, y, 2, 2, 0)?;
            nn::flatten(g, y)
        },
    );
}

/// Average pooling with PyTorch's `count_include_pad=True` divides every window by k²: a 2x2
/// image of ones pooled 3x3 with padding 1 gives 4/9 at each corner window.
#[test]
fn avg_pool2d_counts_the_padding_as_pytorch_does() {
    let mut g = Graph::new();
    let x = g.input("x", [1, 1, 2, 2], DType::F64).unwrap();
    let y = nn::avg_pool2d(&mut g, x, 3, 1, 1).unwrap();
    g.set_output("y", y).unwrap();
    let mut leaves: IndexMap<String, Tensor> = IndexMap::new();
    leaves.insert(
        "x".into(),
        Tensor::from_f64(Shape::new(&[1, 1, 2, 2]), vec![1.0; 4]),
    );
    let out = run_graph(&g, &leaves).unwrap();
    for v in out.outputs["y"].as_f64().unwrap() {
        assert!((v - 4.0 / 9.0).abs() < 1e-15, "{v}");
    }
}
