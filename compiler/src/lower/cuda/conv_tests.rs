//! Tests of the convolutions' lowering to cuDNN operations: host logic, run without a GPU.

use super::*;
use crate::ir::{Conv2d, DType, Graph, Init, NodeId, Op, WindowOp};
use crate::lower::Target;
use crate::pipeline;
use crate::plan::MemoryPlan;
use crate::precision::Precision;
use ingot_kernels::cpu::conv::ConvGeometry;

/// `(in_ch, out_ch, kernel, stride, padding, dilation, groups)` of the convolution under test.
type Layer = (usize, usize, usize, usize, usize, usize, usize);

/// The convolutions checked: stride 2 with padding, dilation, groups, depthwise, 1x1, 7x7.
const LAYERS: [Layer; 6] = [
    (8, 16, 3, 2, 1, 1, 1),
    (8, 8, 3, 1, 2, 2, 1),
    (8, 12, 3, 1, 1, 1, 4),
    (8, 8, 3, 1, 1, 1, 8),
    (8, 16, 1, 1, 0, 1, 1),
    (8, 4, 7, 2, 3, 1, 1),
];

/// The training step (SGD) of `x [2, 3, 14, 14] -> conv 3→8 (3x3, padding 1) -> layer`,
/// loss the sum of the result, compiled for CUDA in `precision`: the layer's convolution has
/// all three passes (its input is the first convolution's output, which needs a gradient).
fn conv_step(layer: Layer, precision: Precision) -> pipeline::Compiled {
    conv_step_with(
        layer,
        precision,
        pipeline::Options::for_target(Target::Cuda),
    )
}

/// [`conv_step`] compiled with `options`.
fn conv_step_with(
    layer: Layer,
    precision: Precision,
    options: pipeline::Options,
) -> pipeline::Compiled {
    let (cin, cout, k, stride, padding, dilation, groups) = layer;
    let mut g = Graph::new();
    let x = g.input("x", [2, 3, 14, 14], DType::F32).unwrap();
    let init = Init::Normal { std: 0.1 };
    let w0 = g.parameter("w0", [cin, 3, 3, 3], DType::F32, init).unwrap();
    let w1 = (g.parameter("w1", [cout, cin / groups, k, k], DType::F32, init)).unwrap();
    let c0 = Conv2d {
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 1,
        layout: Default::default(),
    };
    let h = g.conv2d(x, w0, c0).unwrap();
    let c1 = Conv2d {
        stride: [stride; 2],
        padding: [padding; 2],
        dilation: [dilation; 2],
        groups,
        layout: Default::default(),
    };
    let o = g.conv2d(h, w1, c1).unwrap();
    let l = g.sum_all(o).unwrap();
    g.set_output(crate::autodiff::LOSS, l).unwrap();
    let m = crate::model::Model {
        precision,
        ..crate::model::Model::new(
            "conv",
            g,
            crate::autodiff::optim::Optimizer::Sgd { lr: 0.1 },
        )
    };
    pipeline::compile(&m, &options).unwrap()
}

fn lowered(c: &pipeline::Compiled, precision: Precision) -> Program {
    lower(&c.graph, &c.plan, precision).unwrap()
}

/// The convolution operations of `p`, by node.
fn convs(p: &Program) -> Vec<&Conv> {
    p.ops
        .iter()
        .filter_map(|op| match op {
            DeviceOp::Conv(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// The byte offset of node `id` under `plan`.
fn at(g: &Graph, plan: &MemoryPlan, id: NodeId) -> usize {
    plan.location(g, id).offset
}

#[test]
fn every_convolution_pass_lowers_to_one_cudnn_operation_with_its_geometry_and_planned_bytes() {
    for layer in LAYERS {
        let c = conv_step(layer, Precision::F32);
        let p = lowered(&c, Precision::F32);
        let (g, plan) = (&c.graph, &c.plan);
        let windows: Vec<NodeId> = g
            .ids()
            .filter(|&id| matches!(g.node(id).op, Op::Window(_)))
            .collect();
        let ops = convs(&p);
        // Two forwards, two filter gradients, the second layer's data gradient.
        assert_eq!(ops.len(), 5, "{layer:?}");
        assert_eq!(windows.len(), 5, "{layer:?}");
        let mut passes = Vec::new();
        for op in ops {
            let id = op.node;
            let node = g.node(id);
            let Op::Window(w) = &node.op else {
                panic!("{layer:?}: a convolution op for {}", node.op.name())
            };
            let dims: Vec<&[usize]> = node.inputs.iter().map(|&x| g.ty(x).shape.dims()).collect();
            let (geo, pass) = w.conv_geometry(&dims, node.ty.shape.dims()).unwrap();
            assert_eq!(op.dims, geo, "{layer:?}");
            assert_eq!(op.pass, ConvPass::of(pass), "{layer:?}");
            assert_eq!((op.dtype, op.compute), (DType::F32, Compute::F32));
            let (a, b, here) = (
                at(g, plan, node.inputs[0]),
                at(g, plan, node.inputs[1]),
                at(g, plan, id),
            );
            let expected = match op.pass {
                ConvPass::Forward => (a, b, here),
                ConvPass::Data => (here, b, a),
                ConvPass::Filter => (a, here, b),
            };
            assert_eq!((op.x, op.w, op.y), expected, "{layer:?} {:?}", op.pass);
            assert_eq!(Some(op.workspace), plan.workspace(id), "{layer:?}");
            // The tensors' extents are the planned buffers'.
            let (result, _) = op.result_and_operands();
            assert_eq!(result, plan.location(g, id), "{layer:?} {:?}", op.pass);
            passes.push(op.pass);
            if op.dims.kernel == [layer.2; 2] && op.dims.in_ch == layer.0 {
                let (_, _, k, s, pad, d, groups) = layer;
                assert_eq!(op.dims.kernel, [k, k]);
                assert_eq!(op.dims.stride, [s, s]);
                assert_eq!(op.dims.padding, [pad, pad]);
                assert_eq!(op.dims.dilation, [d, d]);
                assert_eq!(op.dims.groups, groups);
            }
        }
        passes.sort_by_key(|p| *p as u8);
        use ConvPass::*;
        assert_eq!(
            passes,
            [Forward, Forward, Data, Filter, Filter],
            "{layer:?}"
        );
    }
}

#[test]
fn a_convolutions_fallback_is_its_im2col_launches_and_gemms_chunk_by_chunk() {
    for layer in LAYERS {
        let c = conv_step(layer, Precision::F32);
        let p = lowered(&c, Precision::F32);
        for op in convs(&p) {
            let ws = planned_conv_workspace(&c.graph, &c.plan, op.node).unwrap();
            let chunks = op.dims.batch / ws.samples;
            let launches = (op.fallback.iter())
                .filter(|f| matches!(f, DeviceOp::Launch { .. }))
                .count();
            let gemms: Vec<&Gemm> = (op.fallback.iter())
                .filter_map(|f| match f {
                    DeviceOp::Gemm(g) => Some(g),
                    _ => None,
                })
                .collect();
            // im2col (col2im) per chunk; the filter gradient also lays dy side by side.
            let per_chunk = if op.pass == ConvPass::Filter { 2 } else { 1 };
            assert_eq!(launches, per_chunk * chunks, "{layer:?} {:?}", op.pass);
            assert_eq!(launches + gemms.len(), op.fallback.len());
            assert!(!gemms.is_empty());
            assert!(op.fallback.iter().all(|f| f.node() == Some(op.node)));
            for gm in gemms {
                assert_eq!(gm.compute, Compute::F32);
                // Inside the convolution's workspace: cuBLAS's part of it.
                let (w, ws) = (gm.workspace, op.workspace);
                assert!(w.offset >= ws.offset && w.offset + w.bytes <= ws.offset + ws.bytes);
            }
        }
        // Every launch of the fallbacks names a kernel of the program.
        p.check(p.total_bytes).unwrap();
        assert!(p.all_ops().count() > p.ops.len());
    }
}

/// resnet50's stem at 224, batch 128: `x [128, 3, 224, 224]`, `w [64, 3, 7, 7]`, stride 2,
/// padding 3.
fn resnet50_stem(in_ch: usize, groups: usize) -> ConvGeometry {
    ConvGeometry {
        batch: 128,
        in_ch,
        in_hw: [224, 224],
        out_ch: 64,
        kernel: [7, 7],
        stride: [2, 2],
        padding: [3, 3],
        dilation: [1, 1],
        groups,
        out_hw: [112, 112],
    }
}

#[test]
fn a_stem_over_three_channels_asks_room_for_what_cudnn_asked_at_resnet50s_stem() {
    use crate::ir::ConvLayout::{Nchw, Nhwc};
    // The bytes cuDNN 9.19's heuristics asked on an H200 for their first deterministic
    // algorithm at this shape, bf16 (session 39, docs/results/gpu-s39-a-call1-*.txt):
    // (layout, filter gradient, forward).
    for (layout, filter, forward) in [
        (Nchw, 314_453_136, 308_331_536),
        (Nhwc, 108_932_240, 102_810_640),
    ] {
        let room = conv::cudnn_few_channel_room(&resnet50_stem(3, 1), layout, 2);
        assert!(room >= filter && room >= forward, "{layout:?}: {room}");
        // A bound, not a blank cheque: within 2% of what was asked.
        assert!(
            room <= filter + filter / 50,
            "{layout:?}: {room} for {filter}"
        );
        // 4 channels (padded to 8 as well) ask as much as 3.
        assert_eq!(
            conv::cudnn_few_channel_room(&resnet50_stem(4, 1), layout, 2),
            room
        );
        // Convolutions over 8 channels or more, or grouped, ask nothing of the kind.
        for (c, g) in [(8, 1), (64, 1), (3, 3), (6, 2)] {
            assert_eq!(
                conv::cudnn_few_channel_room(&resnet50_stem(c, g), layout, 2),
                0,
                "{c} {g}"
            );
        }
    }
}

/// The step of `x [32, 3, 224, 224] -> conv 3→64 (7x7, stride 2, padding 3) -> conv 64→64
/// (3x3, padding 1)`, loss the sum of the result, f32, compiled for CUDA.
fn stem_step() -> pipeline::Compiled {
    stem_step_in(Precision::F32)
}

/// [`stem_step`] in `precision`.
fn stem_step_in(precision: Precision) -> pipeline::Compiled {
    let mut g = Graph::new();
    let x = g.input("x", [32, 3, 224, 224], DType::F32).unwrap();
    let init = Init::Normal { std: 0.1 };
    let w0 = g.parameter("w0", [64, 3, 7, 7], DType::F32, init).unwrap();
    let w1 = g.parameter("w1", [64, 64, 3, 3], DType::F32, init).unwrap();
    let conv = |s: usize, p: usize| Conv2d {
        stride: [s; 2],
        padding: [p; 2],
        dilation: [1, 1],
        groups: 1,
        layout: Default::default(),
    };
    let h = g.conv2d(x, w0, conv(2, 3)).unwrap();
    let o = g.conv2d(h, w1, conv(1, 1)).unwrap();
    let l = g.sum_all(o).unwrap();
    g.set_output(crate::autodiff::LOSS, l).unwrap();
    let m = crate::model::Model {
        precision,
        ..crate::model::Model::new(
            "stem",
            g,
            crate::autodiff::optim::Optimizer::Sgd { lr: 0.1 },
        )
    };
    pipeline::compile(&m, &pipeline::Options::for_target(Target::Cuda)).unwrap()
}

#[test]
fn a_few_channel_stem_may_grow_its_workspace_to_cudnns_padded_copies_and_a_wide_one_does_not() {
    let c = stem_step();
    let g = &c.graph;
    let mut stem_passes = 0;
    for id in g.ids().filter(|&id| matches!(g.node(id).op, Op::Window(_))) {
        let im2col = conv_workspace(g, id).unwrap();
        let need = workspace_need(g, id);
        // The least is still one image's im2col column and cuBLAS's workspace.
        assert_eq!(need.bytes, conv_workspace_least(g, id).unwrap().total);
        if im2col.geometry.in_ch == 3 {
            stem_passes += 1;
            let room =
                conv::cudnn_few_channel_room(&im2col.geometry, crate::ir::ConvLayout::Nchw, 4);
            assert!(room > im2col.total, "{room} against {}", im2col.total);
            assert_eq!(need.up_to, room, "{:?}", im2col.pass);
        } else {
            assert_eq!(need.up_to, im2col.total, "{:?}", im2col.pass);
        }
    }
    // Its forward and filter gradient; no data gradient (the stem's input is data).
    assert_eq!(stem_passes, 2);
}

#[test]
fn a_tf32_or_bf16_step_convolves_in_its_precision() {
    let layer = LAYERS[0];
    for (precision, dtype, compute) in [
        (Precision::Tf32, DType::F32, Compute::Tf32),
        (Precision::Bf16, DType::BF16, Compute::Bf16F32),
    ] {
        let c = conv_step(layer, precision);
        let p = lowered(&c, precision);
        let ops = convs(&p);
        assert_eq!(ops.len(), 5);
        for op in ops {
            assert_eq!((op.dtype, op.compute), (dtype, compute), "{precision:?}");
            assert!(op.fallback.iter().all(|f| match f {
                DeviceOp::Gemm(g) => g.compute == compute,
                _ => true,
            }));
        }
    }
}

#[test]
fn a_convolution_reads_its_operands_and_writes_its_result_and_whole_workspace() {
    let c = conv_step(LAYERS[2], Precision::F32);
    let p = lowered(&c, Precision::F32);
    for (i, op) in p.ops.iter().enumerate() {
        let DeviceOp::Conv(conv) = op else { continue };
        let (result, operands) = conv.result_and_operands();
        let t = &p.touches[i];
        assert_eq!(t.writes.as_slice(), [result, conv.workspace]);
        for o in operands {
            assert!(t.reads.contains(&o), "{:?} reads {:?}", conv.pass, t.reads);
        }
    }
}

#[test]
fn a_damaged_convolution_is_refused_naming_it() {
    let c = conv_step(LAYERS[0], Precision::F32);
    let p = lowered(&c, Precision::F32);
    let total = p.total_bytes;
    let i = p
        .ops
        .iter()
        .position(|op| matches!(op, DeviceOp::Conv(_)))
        .unwrap();
    let refused = |q: &Program, says: &str| {
        let e = q.check(total).unwrap_err().to_string();
        assert!(e.contains(says), "{says:?} not in {e}");
    };
    let mut q = p.clone();
    if let DeviceOp::Conv(conv) = &mut q.ops[i] {
        conv.y = total;
    }
    refused(&q, "convolution node");
    let mut q = p.clone();
    if let DeviceOp::Conv(conv) = &mut q.ops[i] {
        conv.fallback.push(DeviceOp::Zero {
            offset: 0,
            bytes: 1,
        });
    }
    refused(&q, "fallback");
    let mut q = p.clone();
    if let DeviceOp::Conv(conv) = &mut q.ops[i] {
        if let Some(DeviceOp::Launch { kernel, .. }) = conv.fallback.first_mut() {
            *kernel = 999;
        }
    }
    refused(&q, "kernel 999");
    // And the program's JSON form keeps every convolution and its fallback.
    let back: Program = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
}

/// The training step (SGD) of a parameter image `[2, 8, 14, 14]` max-pooled by a ResNet
/// stem's pooling (3x3, stride 2, padding 1), loss the sum, compiled for CUDA.
fn pool_step() -> pipeline::Compiled {
    let mut g = Graph::new();
    let x = (g.parameter("x", [2, 8, 14, 14], DType::F32, Init::Normal { std: 1.0 })).unwrap();
    let pool = crate::ir::Pool2d {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
        dilation: [1, 1],
        layout: crate::ir::ConvLayout::Nchw,
    };
    let y = g.max_pool2d(x, pool).unwrap();
    let l = g.sum_all(y).unwrap();
    g.set_output(crate::autodiff::LOSS, l).unwrap();
    let m = crate::model::Model::new(
        "pool",
        g,
        crate::autodiff::optim::Optimizer::Sgd { lr: 0.1 },
    );
    pipeline::compile(&m, &pipeline::Options::for_target(Target::Cuda)).unwrap()
}

#[test]
fn a_max_poolings_gradient_picks_into_its_planned_workspace_then_reads_the_picks() {
    let c = pool_step();
    let (g, plan) = (&c.graph, &c.plan);
    let p = lowered(&c, Precision::F32);
    let node = |pick: fn(&WindowOp) -> bool| {
        g.ids()
            .find(|&id| matches!(&g.node(id).op, Op::Window(w) if pick(w)))
            .unwrap()
    };
    let grad = node(|w| matches!(w, WindowOp::MaxPool2dGrad(_)));
    let forward = node(|w| matches!(w, WindowOp::MaxPool2d(_)));
    // A byte a window: 2·8 planes of 7x7 windows.
    assert_eq!(pool_pick_workspace(g, grad), Some(2 * 8 * 7 * 7));
    assert_eq!(pool_pick_workspace(g, forward), None);
    let ws = plan.workspace(grad).unwrap();
    assert!(ws.bytes >= 2 * 8 * 7 * 7, "{ws:?}");
    assert_eq!(plan.workspace(forward), None);
    let launches: Vec<(usize, &DeviceOp)> = (p.ops.iter().enumerate())
        .filter(|(_, op)| matches!(op, DeviceOp::Launch { node, .. } if *node == grad))
        .collect();
    assert_eq!(launches.len(), 2);
    let (x, dy, dx) = (
        plan.location(g, g.node(grad).inputs[0]),
        plan.location(g, g.node(grad).inputs[1]),
        plan.location(g, grad),
    );
    let args = |op: &DeviceOp| match op {
        DeviceOp::Launch { kernel, args, .. } => (&p.kernels[*kernel].source, args.to_vec()),
        _ => unreachable!(),
    };
    let ((first, a0), (second, a1)) = (args(launches[0].1), args(launches[1].1));
    assert!(first.contains("ingot max_pool2d_pick"), "{first}");
    assert!(second.contains("ingot max_pool2d_grad_picked"), "{second}");
    assert_eq!(a0, [x.offset, ws.offset]);
    assert_eq!(a1, [ws.offset, dy.offset, dx.offset]);
    // The gradient waits for the picks: it reads what the first launch writes.
    let (i0, i1) = (launches[0].0, launches[1].0);
    assert!(p.touches[i0].writes.contains(&ws));
    assert!(p.touches[i1].reads.contains(&ws));
    assert!(p.deps[i1].contains(&i0), "{:?}", p.deps[i1]);
    p.check(p.total_bytes).unwrap();
}

/// A channels-last convolution is planned cuDNN's floor (1 MiB, and 8 bytes an element of the
/// filter for the filter gradient) and lowered with no fallback (a depthwise one with its
/// direct kernels, which run in that floor); an
/// NCHW one (the step's first, over three channels) keeps one image's im2col column and
/// cuBLAS's space, which its fallback runs in. The floor asks the planner to keep the other
/// workspaces' ceiling at the im2col column it replaced.
#[test]
fn a_channels_last_convolution_is_planned_cudnns_floor_and_an_nchw_one_its_im2col_column() {
    use ingot_kernels::cpu::conv::Pass;
    let options = pipeline::Options {
        channels_last: crate::layout::ChannelsLast::Yes,
        ..pipeline::Options::for_target(Target::Cuda)
    };
    let (mut nhwc, mut nchw) = (0, 0);
    for layer in LAYERS {
        let c = conv_step_with(layer, Precision::Bf16, options.clone());
        let p = lowered(&c, Precision::Bf16);
        for op in convs(&p) {
            let pass = match op.pass {
                ConvPass::Forward => Pass::Forward,
                ConvPass::Data => Pass::GradInput,
                ConvPass::Filter => Pass::GradWeight,
            };
            let need = workspace_need(&c.graph, op.node);
            let im2col = conv_workspace_least(&c.graph, op.node).unwrap().total;
            assert!(op.workspace.bytes >= need.bytes, "{layer:?} {:?}", op.pass);
            if op.layout == crate::ir::ConvLayout::Nhwc {
                nhwc += 1;
                // Only a depthwise one has a fallback: its direct kernels.
                let direct = ingot_kernels::cuda::depthwise::runs(&op.dims);
                assert_eq!(op.fallback.is_empty(), !direct, "{layer:?}");
                assert_eq!(need.bytes, cudnn_least(&op.dims, pass), "{layer:?}");
                let filter = op.dims.out_ch * op.dims.in_ch / op.dims.groups
                    * op.dims.kernel[0]
                    * op.dims.kernel[1];
                let expected = match pass {
                    Pass::GradWeight => CUDNN_FLOOR + 8 * filter,
                    _ => CUDNN_FLOOR,
                };
                assert_eq!(need.bytes, expected.div_ceil(256) * 256, "{layer:?}");
                assert!(need.bytes < im2col, "{layer:?}: {} >= {im2col}", need.bytes);
                assert_eq!(need.ceiling_bytes, im2col, "{layer:?} {:?}", op.pass);
            } else {
                nchw += 1;
                assert!(!op.fallback.is_empty());
                assert_eq!(
                    need.bytes, im2col,
                    "{layer:?}: an NCHW convolution keeps its column"
                );
                assert_eq!(need.ceiling_bytes, 0, "{layer:?}");
            }
        }
    }
    // Each layer's convolution in its three passes; the first convolution's forward and
    // filter gradient (over three channels) in NCHW.
    assert_eq!((nhwc, nchw), (3 * LAYERS.len(), 2 * LAYERS.len()));
}

#[test]
fn a_bf16_stem_granted_its_room_runs_through_cudnn_by_default_and_an_f32_one_as_im2col() {
    use conv::DefaultRoute as R;
    for (precision, stem_route) in [
        (Precision::Bf16, R::FewChannelsInRoom),
        (Precision::F32, R::Im2col),
    ] {
        let c = stem_step_in(precision);
        let p = lowered(&c, precision);
        let mut stem = 0;
        for op in convs(&p) {
            let route = op.default_route();
            if op.dims.in_ch == 3 {
                stem += 1;
                // The plan granted it the room (nothing else is live to stop it).
                let e = op.dtype.size();
                let room = conv::cudnn_few_channel_room(&op.dims, op.layout, e);
                assert!(op.workspace.bytes >= room, "{precision:?} {:?}", op.pass);
                assert!(room > conv::LARGE_ROOM, "{room}");
                assert_eq!(conv::LARGE_ROOM, COLUMN_BUDGET + CUBLAS_WORKSPACE);
                assert_eq!(route, stem_route, "{precision:?} {:?}", op.pass);
            } else {
                // 64 input channels: never the few-channel route, whatever the room.
                assert_ne!(route, R::FewChannelsInRoom, "{precision:?} {:?}", op.pass);
                assert_eq!(route.cudnn(), op.layout == crate::ir::ConvLayout::Nhwc);
            }
        }
        assert_eq!(stem, 2, "{precision:?}");
        let few = p.counts().convs_few_channel_cudnn;
        assert_eq!(few, if stem_route.cudnn() { 2 } else { 0 });
        let summary = p.summary();
        assert_eq!(
            summary.contains("2 through cuDNN (NCHW over few channels, in its room)"),
            stem_route.cudnn(),
            "{summary}"
        );
        // The same program routes alike every time it is lowered.
        assert_eq!(lowered(&c, precision), p);
    }
}

/// A channels-last depthwise convolution keeps its cuDNN operation and plan, and has Ingot's
/// direct kernels as its fallback, which the default runs: one launch for the forward and the
/// data gradient, two for the filter gradient (partial sums in the planned workspace, then
/// their sum); an NCHW depthwise one keeps im2col, and a grouped one that is not depthwise
/// keeps cuDNN alone.
#[test]
fn a_channels_last_depthwise_convolution_runs_its_direct_kernels_by_default() {
    use ingot_kernels::cuda::depthwise;
    let options = pipeline::Options {
        channels_last: crate::layout::ChannelsLast::Yes,
        ..pipeline::Options::for_target(Target::Cuda)
    };
    let depthwise_layer = LAYERS[3];
    let grouped_layer = LAYERS[2];
    for precision in [Precision::Bf16, Precision::F32] {
        let c = conv_step_with(depthwise_layer, precision, options.clone());
        let p = lowered(&c, precision);
        p.check(p.total_bytes).unwrap();
        let mut passes = 0;
        for op in convs(&p) {
            if op.dims.groups == 1 {
                continue;
            }
            passes += 1;
            assert!(depthwise::runs(&op.dims));
            assert_eq!(op.default_route(), conv::DefaultRoute::Depthwise);
            assert!(!op.default_route().cudnn());
            let launches: Vec<&ingot_kernels::cuda::CudaKernel> = (op.fallback.iter())
                .map(|f| match f {
                    DeviceOp::Launch { kernel, .. } => &p.kernels[*kernel],
                    other => panic!("{other:?} in a depthwise fallback"),
                })
                .collect();
            let want = match op.pass {
                ConvPass::Filter => 2,
                _ => 1,
            };
            assert_eq!(launches.len(), want, "{:?}", op.pass);
            let kind = match op.pass {
                ConvPass::Forward => "depthwise_forward",
                ConvPass::Data => "depthwise_grad_input",
                ConvPass::Filter => "depthwise_grad_weight_partial",
            };
            assert!(launches[0].source.contains(kind), "{:?}", op.pass);
            if op.pass == ConvPass::Filter {
                // Its partial sums lie in the planned workspace.
                let groups =
                    depthwise::grad_weight_groups(op.dtype, &op.dims, op.workspace.bytes).unwrap();
                let bytes =
                    depthwise::depthwise_grad_weight_scratch_bytes(op.dtype, &op.dims, groups);
                assert!(bytes <= op.workspace.bytes);
                let DeviceOp::Launch { args, .. } = &op.fallback[0] else {
                    unreachable!()
                };
                assert_eq!(args[2], op.workspace.offset);
            }
        }
        assert_eq!(passes, 3, "{precision:?}");
        assert!(
            p.default_routes()
                .contains("3 as direct depthwise kernels (channels-last)"),
            "{}",
            p.default_routes()
        );
        // The same step NCHW keeps im2col; lowering again gives the same program.
        let nchw = lowered(&conv_step(depthwise_layer, Precision::F32), Precision::F32);
        assert!(convs(&nchw)
            .iter()
            .all(|op| op.default_route() == conv::DefaultRoute::Im2col));
        assert_eq!(lowered(&c, precision), p);
    }
    let c = conv_step_with(grouped_layer, Precision::Bf16, options);
    let p = lowered(&c, Precision::Bf16);
    for op in convs(&p) {
        if op.layout == crate::ir::ConvLayout::Nhwc {
            assert!(
                op.fallback.is_empty(),
                "groups of 2 channels are not depthwise"
            );
            assert_eq!(op.default_route(), conv::DefaultRoute::ChannelsLast);
        }
    }
}
