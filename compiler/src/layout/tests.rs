use super::*;
use crate::ir::{Conv2d, DType, Init};
use crate::trace::nn;

const CONV: Conv2d = Conv2d {
    stride: [1, 1],
    padding: [1, 1],
    dilation: [1, 1],
    groups: 1,
    layout: ConvLayout::Nchw,
};

fn count(g: &Graph, name: &str) -> usize {
    g.nodes().iter().filter(|n| n.op.name() == name).count()
}

#[test]
fn only_tensors_whose_axes_stay_in_order_have_the_same_bytes_channels_last() {
    assert!(same_bytes(&[8, 64, 1, 1]));
    assert!(same_bytes(&[1, 64, 1, 1]));
    assert!(same_bytes(&[64, 32, 1, 1]));
    assert!(same_bytes(&[8, 1, 5, 5]));
    assert!(!same_bytes(&[8, 64, 2, 1]));
    assert!(!same_bytes(&[64, 32, 3, 3]));
}

/// `relu(conv(relu(conv(x, w1) + b), w2))` summed: an image of `c` channels, two 3x3
/// weights (the second over 8 channels) and a bias.
fn two_convs(c: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.input("x", [2, c, 6, 6], DType::F32).unwrap();
    let w1 = g
        .parameter("w1", [8, c, 3, 3], DType::F32, Init::Zeros)
        .unwrap();
    let w2 = g
        .parameter("w2", [8, 8, 3, 3], DType::F32, Init::Zeros)
        .unwrap();
    let b = g
        .parameter("b", [8, 1, 1], DType::F32, Init::Zeros)
        .unwrap();
    let h = g.conv2d(x, w1, CONV).unwrap();
    let b = g.broadcast_to(b, [2, 8, 6, 6]).unwrap();
    let h = g.add(h, b).unwrap();
    let h = nn::relu(&mut g, h).unwrap();
    let y = g.conv2d(h, w2, CONV).unwrap();
    let y = nn::relu(&mut g, y).unwrap();
    let s = g.sum(y, &[0, 1, 2, 3]).unwrap();
    g.set_output("sum", s).unwrap();
    g
}

#[test]
fn between_two_convolutions_the_bias_and_relu_stay_channels_last_with_no_transpose() {
    let (g, report) = channels_last(&two_convs(8)).unwrap();
    assert_eq!(report.convolutions, 2);
    // The image and the two weights go in; nothing between the convolutions, and the sum of
    // the last ReLU reads channels-last (a reduction computes in its operand's layout).
    assert_eq!(report.transposes, 3, "{g}");
    assert_eq!(count(&g, "transpose"), 3);
    for n in g.nodes() {
        if n.op.name() == "select" || n.op.name() == "add" {
            assert_eq!(n.ty.shape.dims(), [2, 6, 6, 8], "{g}");
        }
    }
    g.verify().unwrap();
}

#[test]
fn an_update_of_a_weight_from_its_channels_last_gradient_is_made_in_nchw() {
    let mut g = Graph::new();
    let x = g.input("x", [2, 8, 6, 6], DType::F32).unwrap();
    let dy = g.input("dy", [2, 4, 6, 6], DType::F32).unwrap();
    let w = g
        .parameter("w", [4, 8, 3, 3], DType::F32, Init::Zeros)
        .unwrap();
    let dw = g.conv2d_grad_weight(x, dy, CONV, [3, 3]).unwrap();
    let step = g.mul_scalar(dw, 0.1).unwrap();
    let new = g.sub(w, step).unwrap();
    g.set_update(w, new).unwrap();
    let (out, report) = channels_last(&g).unwrap();
    // x and dy go in channels-last, dw comes back: one transpose each, the update in NCHW.
    assert_eq!(report.transposes, 3, "{out}");
    let u = out.updates[0];
    assert_eq!(out.ty(u.value).shape.dims(), [4, 8, 3, 3]);
    assert_eq!(out.node(u.value).op.name(), "sub");
}

#[test]
fn a_convolution_over_fewer_than_8_channels_keeps_nchw_and_so_does_what_it_feeds() {
    let (g, report) = channels_last(&two_convs(3)).unwrap();
    // The stem over 3 channels stays NCHW: neither the image nor its weight is transposed.
    assert_eq!(report.convolutions, 1, "{g}");
    assert_eq!(
        conv_layouts(&g),
        [ConvLayout::Nchw, ConvLayout::Nhwc],
        "{g}"
    );
    // Its bias and ReLU stay with it (NCHW); one transpose takes the ReLU to the second
    // convolution, one its weight.
    assert_eq!(report.transposes, 2, "{g}");
    for n in g.nodes() {
        if n.op.name() == "transpose" {
            let from = g.node(n.inputs[0]).op.name();
            assert!(from == "select" || from == "parameter", "{from}: {g}");
        }
        if n.op.name() == "add" {
            assert_eq!(n.ty.shape.dims(), [2, 8, 6, 6], "{g}");
        }
    }
    g.verify().unwrap();
    // The weight gradient of the stem: a gradient pass over 3 input channels keeps NCHW too.
    let mut g = Graph::new();
    let x = g.input("x", [2, 3, 6, 6], DType::F32).unwrap();
    let dy = g.input("dy", [2, 4, 6, 6], DType::F32).unwrap();
    let dw = g.conv2d_grad_weight(x, dy, CONV, [3, 3]).unwrap();
    g.set_output("dw", dw).unwrap();
    let (out, report) = channels_last(&g).unwrap();
    assert_eq!((report.convolutions, report.transposes), (0, 0), "{out}");
    assert_eq!(conv_layouts(&out), [ConvLayout::Nchw]);
}

/// One 3x3 convolution of a `[2, c, 6, 6]` image of `dtype`, summed.
fn one_conv(c: usize, dtype: DType) -> Graph {
    let mut g = Graph::new();
    let x = g.input("x", [2, c, 6, 6], dtype).unwrap();
    let w = g.parameter("w", [8, c, 3, 3], dtype, Init::Zeros).unwrap();
    let y = g.conv2d(x, w, CONV).unwrap();
    let s = g.sum(y, &[0, 1, 2, 3]).unwrap();
    g.set_output("sum", s).unwrap();
    g
}

#[test]
fn by_default_only_a_step_with_bf16_convolutions_goes_channels_last() {
    assert!(pays(&one_conv(8, DType::BF16)));
    assert!(!pays(&one_conv(8, DType::F32)));
    // A bf16 convolution over too few channels stays NCHW, so nothing pays.
    assert!(!pays(&one_conv(3, DType::BF16)));
    assert!(ChannelsLast::WherePays.applies_to(&one_conv(8, DType::BF16)));
    assert!(!ChannelsLast::WherePays.applies_to(&one_conv(8, DType::F32)));
    // Asked for, it applies whatever the precision; never where not asked.
    assert!(ChannelsLast::Yes.applies_to(&one_conv(8, DType::F32)));
    assert!(!ChannelsLast::No.applies_to(&one_conv(8, DType::BF16)));
    assert_eq!(ChannelsLast::from(true), ChannelsLast::Yes);
    assert_eq!(ChannelsLast::default(), ChannelsLast::No);
}

/// A weight gradient over `[n, 64, 56, 56]` images into a `[n, 256, 56, 56]` gradient, summed.
fn wide_grad_weight(n: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.input("x", [n, 64, 56, 56], DType::BF16).unwrap();
    let dy = g.input("dy", [n, 256, 56, 56], DType::BF16).unwrap();
    let dw = g.conv2d_grad_weight(x, dy, CONV, [3, 3]).unwrap();
    g.set_output("dw", dw).unwrap();
    g
}

#[test]
fn a_convolution_with_a_tensor_over_cudnns_32_bit_descriptors_keeps_nchw() {
    // resnet50's widest activations at the batch `plan --max-batch` found for 80 GiB (5,411):
    // 4.3e9 elements, which cuDNN refuses to describe; at batch 128 they go channels-last.
    const { assert!(5411 * 256 * 56 * 56 > MAX_CHANNELS_LAST_ELEMENTS) };
    let (out, report) = channels_last(&wide_grad_weight(5411)).unwrap();
    assert_eq!((report.convolutions, report.transposes), (0, 0), "{out}");
    assert_eq!(conv_layouts(&out), [ConvLayout::Nchw]);
    assert!(!pays(&wide_grad_weight(5411)));
    let (out, report) = channels_last(&wide_grad_weight(128)).unwrap();
    assert_eq!(report.convolutions, 1, "{out}");
    assert_eq!(conv_layouts(&out), [ConvLayout::Nhwc]);
    assert!(pays(&wide_grad_weight(128)));
}

/// A stem over a `[n, 3, side, side]` image of `dtype` (7x7, stride 2, padding 3, to 64
/// channels), its ReLU and 3x3 stride-2 max pooling, then a 3x3 convolution over its 64
/// channels and a ReLU, summed: resnet's first layers without the batch norm.
fn stem(n: usize, side: usize, dtype: DType) -> Graph {
    let mut g = Graph::new();
    let x = g.input("x", [n, 3, side, side], dtype).unwrap();
    let w1 = g
        .parameter("w1", [64, 3, 7, 7], dtype, Init::Zeros)
        .unwrap();
    let w2 = g
        .parameter("w2", [64, 64, 3, 3], dtype, Init::Zeros)
        .unwrap();
    let seven = Conv2d {
        stride: [2, 2],
        padding: [3, 3],
        ..CONV
    };
    let h = g.conv2d(x, w1, seven).unwrap();
    let h = nn::relu(&mut g, h).unwrap();
    let pool = crate::ir::Pool2d {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
        dilation: [1, 1],
        layout: ConvLayout::Nchw,
    };
    let h = g.max_pool2d(h, pool).unwrap();
    let y = g.conv2d(h, w2, CONV).unwrap();
    let y = nn::relu(&mut g, y).unwrap();
    let s = g.sum(y, &[0, 1, 2, 3]).unwrap();
    g.set_output("sum", s).unwrap();
    g
}

fn pool_layouts(g: &Graph) -> Vec<ConvLayout> {
    g.nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Window(WindowOp::MaxPool2d(p) | WindowOp::MaxPool2dGrad(p)) => Some(p.layout),
            _ => None,
        })
        .collect()
}

#[test]
fn a_large_bf16_stem_goes_channels_last_with_its_relu_and_max_pooling() {
    // resnet50's stem at 224, batch 128, bf16: the room cuDNN asks channels-last (the input
    // padded to 8 channels: 102.8 MB) is above LARGE_ROOM.
    let g = stem(128, 224, DType::BF16);
    let stem_id = g
        .ids()
        .find(|&id| matches!(&g.node(id).op, Op::Window(w) if w.conv().is_some()))
        .unwrap();
    assert!(few_channels(&g, stem_id) && few_channels_last(&g, stem_id));
    let (out, report) = channels_last(&g).unwrap();
    assert_eq!(report.convolutions, 2, "{out}");
    assert_eq!(conv_layouts(&out), [ConvLayout::Nhwc, ConvLayout::Nhwc]);
    assert_eq!(pool_layouts(&out), [ConvLayout::Nhwc]);
    // Only the image and the two weights are transposed; the ReLU and the pooling between
    // the convolutions compute channels-last.
    assert_eq!(report.transposes, 3, "{out}");
    for n in out.nodes() {
        if n.op.name() == "transpose" {
            let from = out.node(n.inputs[0]).op.name();
            assert!(from == "input" || from == "parameter", "{from}: {out}");
        }
        if n.op.name() == "max_pool2d" {
            assert_eq!(n.ty.shape.dims(), [128, 56, 56, 64], "{out}");
        }
    }
    out.verify().unwrap();
    assert!(pays(&g));
}

#[test]
fn a_small_or_f32_stem_keeps_nchw_and_so_does_its_pooling() {
    // resnet18's CIFAR-sized stem (room 2.6 MB), and the large stem in f32 (measured for
    // bf16 only): NCHW, and the pooling with it; the second convolution goes channels-last.
    for g in [stem(128, 32, DType::BF16), stem(128, 224, DType::F32)] {
        let (out, report) = channels_last(&g).unwrap();
        assert_eq!(report.convolutions, 1, "{out}");
        assert_eq!(conv_layouts(&out), [ConvLayout::Nchw, ConvLayout::Nhwc]);
        assert_eq!(pool_layouts(&out), [ConvLayout::Nchw]);
        // The pooling's output on its way to the second convolution, and its weight.
        assert_eq!(report.transposes, 2, "{out}");
    }
    // Asked for every convolution, the small stem goes channels-last as the large one does.
    let (out, report) = channels_last_every(&stem(2, 32, DType::F32)).unwrap();
    assert_eq!(report.transposes, 3, "{out}");
    assert_eq!(conv_layouts(&out), [ConvLayout::Nhwc, ConvLayout::Nhwc]);
    assert_eq!(pool_layouts(&out), [ConvLayout::Nhwc]);
    out.verify().unwrap();
}
