//! The plan of a GPT's decode step ([`ingot_models::gpt_decode`]), snapshot-tested as
//! the training steps' plans are (`snapshots.rs`): its KV cache resident beside the weights
//! (reported under `optimizer_state`, the resident region of state leaves), written in place, so
//! a change that moves any figure of the generation step shows up as a reviewable diff.

use ingot_compiler::autodiff::Step;
use ingot_compiler::ir::DType;
use ingot_compiler::pipeline;
use ingot_models::gpt_decode::{gpt_config_of, gpt_decode};

/// The README's main-job model, at batch 1 as `ingot generate` runs it.
const MAIN_JOB: &str = "gpt:vocab=256,d_model=64,layers=2,heads=4,d_ff=256,seq=64,batch=1";

fn compiled(cache: DType) -> pipeline::Compiled {
    let cfg = gpt_config_of(MAIN_JOB).unwrap();
    let g = gpt_decode(&cfg, DType::F32, cache).unwrap();
    let opts = pipeline::Options {
        plan: ingot_compiler::lower::Target::Cpu.plan_options(),
        fuse_attention: false,
        ..Default::default()
    };
    pipeline::compile_step("main job (decode)", Step::forward_only(g), &opts).unwrap()
}

#[test]
fn the_main_jobs_decode_step_plan_report() {
    insta::assert_snapshot!(compiled(DType::F32).report.table());
}

#[test]
fn the_main_jobs_decode_step_writes_every_cache_in_place() {
    let c = compiled(DType::F32);
    let g = &c.graph;
    assert_eq!(g.updates.len(), 4, "K and V of 2 layers");
    for u in &g.updates {
        assert_eq!(
            c.plan.location(g, u.value),
            c.plan.location(g, u.target),
            "the new {} is not written over the cache",
            g.leaf_name(u.target).unwrap()
        );
    }
}

#[test]
fn the_decode_step_plans_and_lowers_for_cuda_in_f32_and_bf16() {
    use ingot_compiler::lower::Target;
    use ingot_compiler::precision::Precision;
    let cfg = gpt_config_of(MAIN_JOB).unwrap();
    for (precision, cache) in [(Precision::F32, DType::F32), (Precision::Bf16, DType::BF16)] {
        let g = precision
            .apply(&gpt_decode(&cfg, DType::F32, cache).unwrap())
            .unwrap();
        let opts = pipeline::Options {
            fuse_attention: false,
            precision: Some(precision),
            ..pipeline::Options::for_target(Target::Cuda)
        };
        let c = pipeline::compile_step("main job (decode)", Step::forward_only(g), &opts).unwrap();
        if let Err(e) = c.executable(Target::Cuda) {
            panic!("{precision}: the decode step does not lower for CUDA: {e}");
        }
    }
}
