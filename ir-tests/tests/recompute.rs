//! Recomputing matmul and attention outputs for the backward pass to fit a memory budget
//! ([`ingot_compiler::fit`]): it changes no result, its plans are valid and under the budget to
//! the byte, it takes the cheapest values first, and a budget the resident state alone is over
//! is refused.

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::fit::{self, FitError, FitOptions, Recomputation};
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline::{self, Compiled, Options, Rewritten};
use ingot_ir_tests::fits::fit_none;
use ingot_ir_tests::losses::cpu_loss_bits;

/// Small enough to run ten CPU steps in well under a second; its attention (seq 16) costs
/// fewer FLOPs per byte kept than its matmuls (d_model 32), so the order is visible.
const GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=128,seq=16,batch=4";

fn rewritten(model: &Model, k: usize) -> Rewritten {
    let step = StepOptions {
        accumulate: k,
        ..Default::default()
    };
    pipeline::rewritten(model, &step, &Options::for_target(Target::Cpu)).unwrap()
}

/// The step of `GPT` at `k` micro-batches: as compiled normally, and with every candidate
/// recomputed.
fn without_and_with(k: usize) -> (Compiled, Compiled, fit::Recompute) {
    let whole = ingot_models::by_name(GPT).unwrap();
    let m = if k > 1 {
        ingot_models::at_batch(GPT, 4 / k, ingot_compiler::ir::DType::F32).unwrap()
    } else {
        whole
    };
    let r = rewritten(&m, k);
    let base = pipeline::finish(&r, &[]).unwrap();
    let cands = fit::ordered_candidates(&r).unwrap();
    let (all, info) = fit::recompute(&r, &base, &cands, cands.len()).unwrap();
    (base, all, info)
}

/// The loss bits of `steps` CPU steps of `c` (leaves from seed 3).
fn losses(c: &Compiled, steps: usize) -> Vec<u64> {
    cpu_loss_bits(c, 3, steps)
}

#[test]
fn recomputing_every_matmul_and_attention_output_changes_no_loss_over_ten_cpu_steps() {
    for k in [1, 2] {
        let (base, all, info) = without_and_with(k);
        let ops: Vec<&str> = info.values.iter().map(|v| v.op.as_str()).collect();
        assert!(
            ops.contains(&"matmul") && ops.contains(&"attention"),
            "k={k}: recomputed {ops:?}"
        );
        assert!(info.added_flops > 0, "k={k}: {info:?}");
        let g = &all.graph;
        assert!(
            g.ids().any(|id| g.node(id).op.name() == "matmul"
                && g.origin(id).label().contains("(recomputed)")),
            "k={k}: no matmul is recomputed in the step graph"
        );
        assert_eq!(
            losses(&base, 10),
            losses(&all, 10),
            "k={k}: losses differ with recomputation"
        );
    }
}

/// One step only: with two micro-batches of this tiny GPT, recomputing everything is 3 KiB
/// over the plan without it (the copies' buffers outweigh what they free at that size); the
/// fitter measures and takes a prefix, or accumulation, instead.
#[test]
fn recomputation_lowers_the_peak_of_a_small_gpt() {
    let (base, all, _) = without_and_with(1);
    assert!(
        all.report.total_bytes < base.report.total_bytes,
        "{} with recomputation, {} without",
        all.report.total_bytes,
        base.report.total_bytes
    );
}

#[test]
fn a_plan_fitted_by_recomputation_is_under_the_budget_to_the_byte_and_valid() {
    let (base, all, _) = without_and_with(1);
    let m = ingot_models::by_name(GPT).unwrap();
    // Between the two: recomputation must do it, and not all of it may be needed.
    for budget in [
        all.report.total_bytes,
        (all.report.total_bytes + base.report.total_bytes) / 2,
        base.report.total_bytes - 1,
    ] {
        let opts = FitOptions {
            recompute: true,
            ..fit_none(budget)
        };
        let (_, c, fitted) = fit::fit(
            &m,
            &StepOptions::default(),
            &Options::for_target(Target::Cpu),
            &opts,
            None,
        )
        .unwrap();
        let f = fitted.expect("over the budget as asked, so fitted");
        let r = f.recompute.as_ref().expect("fitted by recomputation");
        assert!(!r.values.is_empty() || !r.segments.is_empty());
        assert!(
            c.report.total_bytes <= budget,
            "{} > {budget}",
            c.report.total_bytes
        );
        assert_eq!(f.total_bytes, c.report.total_bytes);
        assert_eq!(f.accumulate, 1);
        c.plan.validate(&c.graph).unwrap();
        c.executable(Target::Cpu).unwrap();
    }
}

#[test]
fn recomputation_takes_the_values_with_the_fewest_flops_per_byte_first() {
    let m = ingot_models::by_name(GPT).unwrap();
    let r = rewritten(&m, 1);
    let cands = fit::ordered_candidates(&r).unwrap();
    let ratio = |c: &ingot_compiler::fuse::remat::Candidate| c.flops as f64 / c.bytes as f64;
    assert!(cands.windows(2).all(|w| ratio(&w[0]) <= ratio(&w[1])));
    // Here attention (seq 16) is cheaper per byte than the matmuls (d_model 32).
    let g = ingot_compiler::fuse::prepared(&r.graph).unwrap();
    assert_eq!(g.node(cands[0].node).op.name(), "attention");
    // A budget just under the step's plan is met by a prefix of that order.
    let base = pipeline::finish(&r, &[]).unwrap();
    let Recomputation::Fits(c, info) =
        fit::recompute_to_budget(&r, &base, base.report.total_bytes - 1).unwrap()
    else {
        panic!("recomputation does not fit a budget one byte under the plan");
    };
    assert!(c.report.total_bytes < base.report.total_bytes);
    assert!(info.values.len() < cands.len(), "{info:?}");
    let chosen_worst = info.values.iter().map(|v| v.flops as f64 / v.bytes as f64);
    let unchosen_best = cands
        .iter()
        .skip(info.values.len())
        .map(ratio)
        .fold(f64::INFINITY, f64::min);
    assert!(chosen_worst.fold(0.0, f64::max) <= unchosen_best);
}

#[test]
fn a_budget_under_the_resident_bytes_is_refused_naming_them() {
    let m = ingot_models::by_name(GPT).unwrap();
    let base = pipeline::finish(&rewritten(&m, 1), &[]).unwrap();
    let resident = base.report.resident_bytes;
    let opts = FitOptions {
        recompute: true,
        accumulate: true,
        ..fit_none(resident - 1)
    };
    let build = |k: usize| {
        ingot_models::at_batch(GPT, 4 / k, ingot_compiler::ir::DType::F32)
            .map_err(|e| e.to_string())
    };
    let err = fit::fit(
        &m,
        &StepOptions::default(),
        &Options::for_target(Target::Cpu),
        &opts,
        Some(&build),
    )
    .unwrap_err();
    assert!(matches!(err, FitError::Resident { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&resident.to_string()), "{msg}");
    assert!(msg.contains("resident"), "{msg}");
}

/// The attention's operands (q, k, v: a kernel's split of the recomputed qkv product) are
/// recomputed with that product: with every candidate recomputed, each `attention_grad` reads
/// copies made after the loss, so no forward q, k or v is kept for the backward pass.
#[test]
fn values_computed_from_a_recomputed_product_are_recomputed_with_it_not_kept() {
    let (_, all, _) = without_and_with(1);
    let g = &all.graph;
    let loss = g.outputs["loss"];
    let grads: Vec<_> = g
        .ids()
        .filter(|&id| matches!(g.node(id).op, ingot_compiler::ir::Op::AttentionGrad { .. }))
        .collect();
    assert!(!grads.is_empty(), "the GPT's attention is fused");
    for id in grads {
        for &x in &g.node(id).inputs[..3] {
            assert!(
                x > loss,
                "{id} reads {x} ({}) from the forward pass",
                g.origin(x).label()
            );
        }
    }
}

#[test]
fn the_loss_head_in_smaller_chunks_is_tried_before_micro_batches() {
    // gpt2 in bf16 under 3,174 MiB (what PyTorch's block checkpointing peaks at): with the
    // head in chunks of the default size even recomputing every candidate is over, so the
    // fitter used to accumulate 8 micro-batches of 1; chunks of half the size fit at the whole
    // batch with some library outputs recomputed.
    let model = ingot_models::by_name("gpt2").unwrap();
    let mut opts = Options::for_target(Target::Cuda);
    opts.precision = Some(ingot_compiler::precision::Precision::Bf16);
    let budget = 3174 << 20;
    let fit_opts = FitOptions {
        recompute: true,
        accumulate: true,
        ..fit_none(budget)
    };
    let build = |k: usize| {
        ingot_models::at_batch("gpt2", 8 / k, ingot_compiler::ir::DType::F32)
            .map_err(|e| e.to_string())
    };
    let (_, c, fitted) = fit::fit(
        &model,
        &StepOptions::default(),
        &opts,
        &fit_opts,
        Some(&build),
    )
    .unwrap();
    let f = fitted.expect("gpt2 is over 3,174 MiB as asked");
    assert_eq!(f.accumulate, 1, "{}", f.line());
    assert!(f.chunked_loss_head);
    // (Since whole segments are recomputed too, the default chunks fit this budget: the
    // smaller ones are no longer needed here, but still come before micro-batches.)
    let chunk = f.loss_head_chunk_bytes.expect("the chunk size is reported");
    assert!(
        (fit::MIN_HEAD_CHUNK_BYTES..=ingot_compiler::autodiff::chunk::HEAD_CHUNK_BYTES)
            .contains(&chunk),
        "{chunk}"
    );
    assert!(f.line().contains("row chunks"), "{}", f.line());
    assert!(c.report.total_bytes <= budget);
    c.plan.validate(&c.graph).unwrap();
}

#[test]
fn a_bf16_step_over_its_budget_by_no_more_than_its_weight_copies_gives_them_up_first() {
    let model = ingot_models::by_name(GPT).unwrap();
    let mut opts = Options::for_target(Target::Cpu);
    opts.precision = Some(ingot_compiler::precision::Precision::Bf16);
    let plan = |cast: bool| {
        let step = StepOptions {
            cast_weights_each_step: cast,
            ..Default::default()
        };
        let r = pipeline::rewritten(&model, &step, &opts).unwrap();
        pipeline::finish(&r, &[]).unwrap().report
    };
    let (kept, cast) = (plan(false), plan(true));
    assert!(kept.resident.weight_copies > 0);
    assert_eq!(cast.resident.weight_copies, 0);
    assert!(cast.total_bytes < kept.total_bytes);
    let fit_opts = FitOptions {
        recompute: true,
        accumulate: true,
        ..fit_none(cast.total_bytes)
    };
    let (_, c, fitted) = fit::fit(&model, &StepOptions::default(), &opts, &fit_opts, None).unwrap();
    let f = fitted.expect("over the budget with its copies");
    assert!(f.weights_cast_each_step, "{}", f.line());
    assert!(f.recompute.is_none() && f.accumulate == 1 && !f.chunked_loss_head);
    assert!(
        f.line().contains("cast to bf16 in each step"),
        "{}",
        f.line()
    );
    assert_eq!(c.report.total_bytes, cast.total_bytes);
}
