//! Channels-last convolutions (`ingot_compiler::layout`, issue 48): a CNN's step rewritten to
//! store its convolutions NHWC computes the NCHW step's losses and updates (the reference
//! interpreter runs both), its planned execution matches the interpreter bit for bit, the
//! transposes it keeps are few and never adjacent, a convolution over fewer than 8 input
//! channels (a stem) keeps NCHW, and a CPU step is not rewritten.

use indexmap::IndexMap;
use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::ir::{ConvLayout, Graph, Op, WindowOp};
use ingot_compiler::layout::{
    channels_last, channels_last_every, conv_layouts, MIN_CHANNELS_LAST_CHANNELS,
};
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::{pipeline, plan};
use ingot_models as models;
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::tensor::Tensor;
use ingot_testkit::steps::{assert_planned_matches_reference, seeded_leaves};

/// The step of `m` as the pipeline hands it to fusion (traced, differentiated, rewritten).
fn rewritten(m: &Model) -> Graph {
    let opts = pipeline::Options::for_target(Target::Cpu);
    pipeline::rewritten(m, &StepOptions::default(), &opts)
        .unwrap()
        .graph
}

fn transposes(g: &Graph) -> Vec<ingot_compiler::ir::NodeId> {
    g.ids()
        .filter(|&id| matches!(g.node(id).op, Op::Transpose { .. }))
        .collect()
}

/// Each convolution pass's input channels and layout.
fn convolution_channels(g: &Graph) -> Vec<(usize, ConvLayout)> {
    g.nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Window(w) if w.conv().is_some() => {
                let dims: Vec<&[usize]> = n.inputs.iter().map(|&x| g.ty(x).shape.dims()).collect();
                let (geo, _) = w.conv_geometry(&dims, n.ty.shape.dims()).unwrap();
                Some((geo.in_ch, w.layout()))
            }
            _ => None,
        })
        .collect()
}

/// The largest difference between `a` and `b` relative to `b`'s largest magnitude.
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    a.iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Runs `steps` steps of the NCHW step and of its channels-last rewrite through the reference
/// interpreter from the same leaves, and asserts that each step's loss agrees to `tol`
/// (relative) and that each updated leaf's change (the learning rate times the gradient, with
/// momentum) agrees to `tol` relative to its largest element: `tol.0` for the first step,
/// `tol.1` for the later ones, whose leaves carry the first steps' rounding.
fn same_steps(what: &str, m: &Model, steps: usize, tols: (f64, f64)) {
    same_steps_by(what, m, steps, tols, false)
}

/// [`same_steps`]; with `every`, the stem channels-last too ([`channels_last_every`]), and its
/// max pooling with it.
fn same_steps_by(what: &str, m: &Model, steps: usize, tols: (f64, f64), every: bool) {
    let nchw = rewritten(m);
    let (nhwc, report) = match every {
        true => channels_last_every(&nchw).unwrap(),
        false => channels_last(&nchw).unwrap(),
    };
    assert!(report.convolutions > 0, "{what}: {report:?}");
    // Every convolution is channels-last but those over fewer than 8 input channels (the
    // stem over the image), which keep NCHW.
    let channels = convolution_channels(&nhwc);
    assert!(
        channels.iter().any(|&(_, l)| l == ConvLayout::Nhwc),
        "{what}"
    );
    for (c, l) in channels {
        let want = match c < MIN_CHANNELS_LAST_CHANNELS && !every {
            true => ConvLayout::Nchw,
            false => ConvLayout::Nhwc,
        };
        assert_eq!(l, want, "{what}: a convolution over {c} input channels");
    }
    let mut a: IndexMap<String, Tensor> = seeded_leaves(&nchw, 7);
    let mut b = a.clone();
    for s in 0..steps {
        let tol = if s == 0 { tols.0 } else { tols.1 };
        let mut va = run_graph(&nchw, &a).unwrap();
        let mut vb = run_graph(&nhwc, &b).unwrap();
        let (la, lb) = (
            va.outputs["loss"].to_f64_vec()[0],
            vb.outputs["loss"].to_f64_vec()[0],
        );
        assert!(
            (la - lb).abs() <= tol * la.abs().max(1.0),
            "{what} step {s}: loss {lb} channels-last against {la} NCHW"
        );
        let mut worst = 0f64;
        for (name, new) in &va.updates {
            let old = &a[name];
            let delta = |t: &Tensor| -> Tensor {
                let v: Vec<f64> = t
                    .to_f64_vec()
                    .iter()
                    .zip(old.to_f64_vec())
                    .map(|(x, y)| x - y)
                    .collect();
                Tensor::from_f64(ingot_compiler::ir::Shape::new(t.dims()), v)
            };
            let got = &vb.updates[name];
            assert_eq!(got.ty, new.ty, "{what}: {name}");
            let r = relative(&delta(got), &delta(new));
            worst = worst.max(r);
            assert!(
                r <= tol,
                "{what} step {s}: the update of {name} differs by {r:e} of its largest change"
            );
        }
        eprintln!(
            "{what} step {s}: loss {lb} against {la} ({:.1e}), updates within {worst:.1e}",
            (la - lb).abs() / la.abs()
        );
        va.apply_updates(&mut a);
        vb.apply_updates(&mut b);
    }
}

/// torchvision's resnet at `depth` and `side`, batch 2, in f64, where a wrong axis or layout
/// would show far above rounding. At side 64 a first step agrees to about 1e-12. (At side 32
/// layer4's batch norms see two values per channel, and even in f64 the rewritten reductions'
/// other summation order grows to 1e-6 after one step and 1e-4 after two; in f32, to 1e-2.)
fn resnet_f64(depth: usize, side: usize) -> Model {
    let cfg = models::ResNetConfig {
        depth,
        side,
        batch: 2,
        ..models::ResNetConfig::DEFAULTS
    };
    models::resnet(&cfg, ingot_compiler::ir::DType::F64).unwrap()
}

#[test]
fn a_channels_last_resnet18_step_computes_the_nchw_steps_losses_and_updates() {
    same_steps("resnet18", &resnet_f64(18, 64), 3, (1e-10, 1e-10));
}

#[test]
fn a_channels_last_resnet50_step_computes_the_nchw_steps_loss_and_updates() {
    same_steps("resnet50", &resnet_f64(50, 64), 1, (1e-10, 1e-10));
}

/// The CPU path for a channels-last stem: resnet18 (torchvision's, with its max pooling) with
/// its stem, batch norm, ReLU and max pooling channels-last computes the NCHW step's losses
/// and updates in f64, and its planned execution is the interpreter's bit for bit.
#[test]
fn a_channels_last_stem_and_its_max_pooling_compute_the_nchw_steps_losses_and_updates() {
    let m = resnet_f64(18, 64);
    same_steps_by("resnet18, stem channels-last", &m, 3, (1e-10, 1e-10), true);
    let (g, report) = channels_last_every(&rewritten(&m)).unwrap();
    let pools: Vec<_> = g
        .nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Window(WindowOp::MaxPool2d(p) | WindowOp::MaxPool2dGrad(p)) => Some(p.layout),
            _ => None,
        })
        .collect();
    assert_eq!(pools, [ConvLayout::Nhwc, ConvLayout::Nhwc], "{report:?}");
    let spec = "resnet:depth=18,side=32,batch=2";
    let small = models::by_name(spec).unwrap();
    let (g, _) = channels_last_every(&rewritten(&small)).unwrap();
    let p = plan::plan(&g, &Target::Cpu.plan_options()).unwrap();
    assert_planned_matches_reference(spec, &g, p, 5, 2);
}

#[test]
fn a_channels_last_cnn_step_computes_the_nchw_steps_losses_and_updates() {
    let m = models::by_name("cnn").unwrap();
    same_steps("cnn", &m, 3, (1e-5, 1e-5));
}

#[test]
fn planned_channels_last_steps_are_bit_identical_to_the_reference_interpreter() {
    for spec in ["cnn", "resnet:depth=18,side=32,batch=2"] {
        let m = models::by_name(spec).unwrap();
        let (g, _) = channels_last(&rewritten(&m)).unwrap();
        let p = plan::plan(&g, &Target::Cpu.plan_options()).unwrap();
        assert_planned_matches_reference(spec, &g, p, 5, 2);
    }
}

#[test]
fn resnet50s_channels_last_step_keeps_few_transposes_and_none_adjacent() {
    let m = models::by_name("resnet:depth=50,side=224,batch=2").unwrap();
    let nchw = rewritten(&m);
    let (g, report) = channels_last(&nchw).unwrap();
    let t = transposes(&g);
    for &id in &t {
        let x = g.node(id).inputs[0];
        assert!(
            !matches!(g.node(x).op, Op::Transpose { .. }),
            "transpose {id:?} reads transpose {x:?}"
        );
    }
    let convs = conv_layouts(&g).len();
    eprintln!("resnet50 channels-last: {report:?}, {convs} convolution passes");
    assert_eq!(report.transposes, t.len());
    assert_eq!(
        convs,
        53 * 3 - 1,
        "every conv has its three passes but the stem's data gradient"
    );
    // The stem (3 input channels) keeps NCHW, its forward and filter gradient, and with it
    // its batch norm, ReLU and max pooling: the image and the stem's weight go in as they are.
    let nchw_convs = conv_layouts(&g)
        .iter()
        .filter(|&&l| l == ConvLayout::Nchw)
        .count();
    assert_eq!(nchw_convs, 2, "the stem's forward and filter gradient");
    // What is transposed: each of the 16 weights past the stem that are not 1x1 (a 1x1
    // weight's bytes are the same both ways) on its way in, and its gradient on its way to
    // the optimizer; the max pooling's output on its way to layer 1, and the gradient that
    // layer 1 sends back to the pooling.
    let mut from = std::collections::BTreeMap::new();
    for &id in &t {
        *from
            .entry(g.node(g.node(id).inputs[0]).op.name())
            .or_insert(0) += 1;
    }
    let want = [
        ("add", 1),
        ("conv2d_grad_weight", 16),
        ("max_pool2d", 1),
        ("parameter", 16),
    ];
    assert_eq!(
        from,
        want.into_iter().collect(),
        "what each transpose reads"
    );
    // 39 while the stem went channels-last (session 34).
    assert_eq!(t.len(), 34);
}

#[test]
fn a_cpu_step_is_not_rewritten_and_a_step_without_convolutions_is_unchanged() {
    let m = models::by_name("cnn").unwrap();
    let c = pipeline::compile(&m, &pipeline::Options::for_target(Target::Cpu)).unwrap();
    assert_eq!(
        pipeline::Options::for_target(Target::Cuda).channels_last,
        ingot_compiler::layout::ChannelsLast::No
    );
    assert!(conv_layouts(&c.graph)
        .iter()
        .all(|&l| l == ConvLayout::Nchw));
    assert!(transposes(&c.graph).is_empty());
    let mlp = rewritten(&models::by_name("mlp").unwrap());
    let (same, report) = channels_last(&mlp).unwrap();
    assert_eq!(same, mlp);
    assert_eq!(report.convolutions, 0);
}

#[test]
fn a_channels_last_step_prints_its_layout_and_parses_back() {
    let m = models::by_name("cnn").unwrap();
    let (g, _) = channels_last(&rewritten(&m)).unwrap();
    let text = g.to_string();
    assert!(text.contains("layout=nhwc"), "{text}");
    let back = ingot_compiler::ir::text::parse(&text).unwrap();
    assert_eq!(back.to_string(), text);
    let w = g
        .nodes()
        .iter()
        .find_map(|n| match &n.op {
            Op::Window(w @ WindowOp::Conv2dGradWeight { .. }) => Some(*w),
            _ => None,
        })
        .unwrap();
    assert_eq!(w.layout(), ConvLayout::Nhwc);
}
