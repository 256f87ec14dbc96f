//! The budget fitter's cheapest candidates in a CNN: the ReLU masks fusion keeps for the
//! backward pass (a ResNet block's last ReLU), recomputed from the ReLU's output, which the
//! backward pass keeps anyway ([`ingot_compiler::fuse::relu_mask`],
//! [`ingot_compiler::fuse::remat::mask_candidates`]). A fitted step recomputing them trains to
//! the unfitted step's losses, bit for bit, and its plan is valid and under the budget.

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::fit::{self, Choice, FitOptions};
use ingot_compiler::fuse::{self, Kind};
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Options, Rewritten};
use ingot_compiler::precision::Precision;
use ingot_ir_tests::fits::fit_none;
use ingot_ir_tests::losses::cpu_loss_bits;

/// A bottleneck ResNet (resnet50's 16 blocks) at a size the CPU trains in moments.
const RESNET50: &str = "resnet:depth=50,side=32,batch=2,classes=5,width=8";

/// The same at 64x64 and batch 4: its activations, not its weights, are most of its plan, so
/// three quarters of the plan is a budget recomputation can meet.
const RESNET50_64: &str = "resnet:depth=50,side=64,batch=4,classes=5,width=8";

fn options(precision: Precision) -> Options {
    Options {
        precision: Some(precision),
        ..Options::for_target(Target::Cpu)
    }
}

/// As the fitter has the step by the time it recomputes: the weights cast in each pass (so
/// that dropping their bf16 copies cannot meet a budget alone).
fn step() -> StepOptions {
    StepOptions {
        cast_weights_each_step: true,
        ..Default::default()
    }
}

fn rewritten(opts: &Options) -> Rewritten {
    let m = ingot_models::by_name(RESNET50).unwrap();
    pipeline::rewritten(&m, &step(), opts).unwrap()
}

/// The library calls' way's choices (no segments), each with whether it is a library call
/// (a convolution) and its layer.
fn choices(r: &Rewritten, opts: &Options) -> Vec<(Choice, bool, String)> {
    let g = fuse::prepared_with(&r.graph, opts.fuse.as_ref().unwrap()).unwrap();
    fit::ordered_choices(r, None)
        .unwrap()
        .into_iter()
        .map(|c| {
            let Choice::Value(v) = &c else {
                panic!("no segments were asked for")
            };
            let library = fuse::kind(g.node(v.node)) == Kind::Library;
            (c.clone(), library, g.origin(v.node).label())
        })
        .collect()
}

/// The masks `r`'s step recomputes when `masks` are asked for ([`fuse::remat::recompute_with`]
/// on the graph fusion recomputes in), each with the op of the value its copy compares.
fn mask_copies(r: &Rewritten, opts: &Options, masks: &[Choice]) -> Vec<(String, String)> {
    let fo = opts.fuse.as_ref().unwrap();
    let p = fuse::prepared_with(&r.graph, fo).unwrap();
    let ids: Vec<_> = masks
        .iter()
        .map(|c| match c {
            Choice::Value(v) => v.node,
            Choice::Segment(_) => panic!("no segments were asked for"),
        })
        .collect();
    let (g, _, _) = fuse::remat::recompute_with(&p, fo.recompute_ops, &ids).unwrap();
    g.ids()
        .filter(|&id| g.origin(id).label().contains("(recomputed)"))
        .filter(|&id| g.ty(id).dtype == ingot_compiler::ir::DType::Bool)
        .map(|id| {
            let read = g.node(id).inputs[0];
            (g.origin(id).label(), g.node(read).op.name().to_string())
        })
        .collect()
}

#[test]
fn every_block_output_mask_of_a_resnet_is_offered_before_any_convolution_output() {
    let opts = options(Precision::F32);
    let r = rewritten(&opts);
    let all = choices(&r, &opts);
    let first_conv = all
        .iter()
        .position(|(_, lib, _)| *lib)
        .expect("convolutions");
    let masks: Vec<&String> = all
        .iter()
        .filter(|(_, lib, _)| !*lib)
        .map(|(_, _, l)| l)
        .collect();
    assert!(
        all.iter().rposition(|(_, lib, _)| !*lib).expect("masks") < first_conv,
        "{all:?}"
    );
    // Each of resnet50's 16 blocks offers one at least (its last ReLU's; at this size the
    // 2x2 and 4x4 blocks' inner masks are kept too, and offered).
    let mut blocks: Vec<String> = masks
        .iter()
        .filter_map(|l| l.strip_suffix(".relu").map(str::to_string))
        .collect();
    blocks.sort();
    blocks.dedup();
    assert_eq!(blocks.len(), 16, "{masks:?}");
}

/// Every mask offered, recomputed: each gets a copy comparing the ReLU's output (a
/// `select`), not its input, and the plan is smaller, valid, and trains to the unfitted step's losses bit for
/// bit, in f32 and in bf16.
#[test]
fn a_relu_mask_recomputed_from_its_output_frees_its_bytes_and_changes_no_loss() {
    for precision in [Precision::F32, Precision::Bf16] {
        let opts = options(precision);
        let r = rewritten(&opts);
        let base = pipeline::finish(&r, &[]).unwrap();
        let masks: Vec<Choice> = choices(&r, &opts)
            .into_iter()
            .filter(|(_, lib, _)| !*lib)
            .map(|(c, _, _)| c)
            .collect();
        let (c, info) = fit::recompute_choices(&r, &base, &masks, masks.len()).unwrap();
        assert_eq!(info.values.len(), masks.len(), "{precision:?}: {info:?}");
        let copies = mask_copies(&r, &opts, &masks);
        let from_output = copies.iter().filter(|(_, read)| read == "select").count();
        assert_eq!(from_output, masks.len(), "{precision:?}: {copies:?}");
        assert!(
            c.report.total_bytes < base.report.total_bytes,
            "{precision:?}: {} with the masks recomputed, {} without",
            c.report.total_bytes,
            base.report.total_bytes
        );
        c.plan.validate(&c.graph).unwrap();
        assert_eq!(
            cpu_loss_bits(&c, 3, 3),
            cpu_loss_bits(&base, 3, 3),
            "{precision:?}"
        );
    }
}

/// The budget recomputing every mask meets: the fitter meets it with masks alone (no
/// convolution, no segment, under half a percent more arithmetic: a comparison an element).
#[test]
fn a_resnet_fitted_to_what_its_masks_free_recomputes_no_convolution() {
    let opts = options(Precision::Bf16);
    let r = rewritten(&opts);
    let base = pipeline::finish(&r, &[]).unwrap();
    let masks: Vec<Choice> = choices(&r, &opts)
        .into_iter()
        .filter(|(_, lib, _)| !*lib)
        .map(|(c, _, _)| c)
        .collect();
    let (reference, _) = fit::recompute_choices(&r, &base, &masks, masks.len()).unwrap();
    let budget = reference.report.total_bytes;
    let m = ingot_models::by_name(RESNET50).unwrap();
    let fit_opts = FitOptions {
        recompute: true,
        ..fit_none(budget)
    };
    let (_, c, fitted) = fit::fit(&m, &step(), &opts, &fit_opts, None).unwrap();
    let f = fitted.expect("over the budget as asked");
    let rec = f
        .recompute
        .as_ref()
        .unwrap_or_else(|| panic!("{}", f.line()));
    assert!(rec.segments.is_empty(), "{}", f.line());
    assert!(
        !rec.values.is_empty() && rec.values.iter().all(|v| v.op != "conv2d"),
        "{}",
        f.line()
    );
    assert!(rec.added_percent < 0.5, "{}", f.line());
    assert!(c.report.total_bytes <= budget);
    c.plan.validate(&c.graph).unwrap();
}

/// Issue 48's memory goal at a CPU's size: the small resnet50 fitted to three quarters of its
/// unfitted plan in f32, by recomputation alone (in bf16 its plan is more of weights and
/// their bf16 copies, and recomputation alone does not reach four fifths of it; the masks'
/// bf16 bits are the test above's); the plan is valid and under the budget, it
/// recomputes masks from their outputs, and it trains to the unfitted step's losses bit for
/// bit (recomputation repeats the forward arithmetic and changes no sum's order).
#[test]
fn a_resnet_fitted_to_three_quarters_of_its_plan_trains_to_the_unfitted_losses_bit_for_bit() {
    let precision = Precision::F32;
    let opts = options(precision);
    let m = ingot_models::by_name(RESNET50_64).unwrap();
    let unfitted = pipeline::finish(
        &pipeline::rewritten(&m, &StepOptions::default(), &opts).unwrap(),
        &[],
    )
    .unwrap();
    let budget = unfitted.report.total_bytes * 3 / 4;
    let fit_opts = FitOptions {
        recompute: true,
        ..fit_none(budget)
    };
    let (_, c, fitted) = fit::fit(&m, &StepOptions::default(), &opts, &fit_opts, None).unwrap();
    let f = fitted.expect("over the budget as asked");
    assert_eq!(f.accumulate, 1, "{precision:?}: {}", f.line());
    assert!(
        c.report.total_bytes <= budget,
        "{precision:?}: {}",
        f.line()
    );
    c.plan.validate(&c.graph).unwrap();
    let rec = f.recompute.as_ref().expect("recomputation");
    assert!(
        rec.values.iter().any(|v| v.op == "le"),
        "{precision:?}: {}",
        f.line()
    );
    assert_eq!(
        cpu_loss_bits(&c, 3, 3),
        cpu_loss_bits(&unfitted, 3, 3),
        "{precision:?}: {}",
        f.line()
    );
}
