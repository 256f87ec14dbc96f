//! Planned execution: one allocation of exactly the plan's total, and steps that compute the
//! same bits as the unplanned reference interpreter.

use indexmap::IndexMap;
use ingot_compiler::autodiff::training_step;
use ingot_compiler::ir::{DType, Graph};
use ingot_compiler::lower::LowerError;
use ingot_compiler::plan;
use ingot_compiler::plan::check::PlanViolation;
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_testkit::steps::{
    assert_planned_matches_reference, cpu_executable, same_bits, seeded_leaves, step_bytes,
};
use ingot_trainer::session::Session;

/// Runs `steps` training steps of `spec` planned and by the reference interpreter, comparing
/// the loss and every leaf, bit for bit.
fn planned_matches_reference(spec: &str, steps: usize) {
    let m = ingot_models::by_name(spec).unwrap();
    let g = training_step(&m.graph, &m.optimizer).unwrap().graph;
    let p = plan::plan(&g, &ingot_compiler::lower::Target::Cpu.plan_options()).unwrap();
    assert_planned_matches_reference(spec, &g, p, 3, steps);
}

#[test]
fn planned_mlp_steps_are_bit_identical_to_the_reference_interpreter() {
    planned_matches_reference("mlp", 2);
}

#[test]
fn planned_gpt_steps_are_bit_identical_to_the_reference_interpreter() {
    planned_matches_reference(
        "gpt:vocab=128,d_model=32,layers=2,heads=4,d_ff=64,seq=16,batch=2",
        3,
    );
}

/// The loss and every leaf after each of `steps` fused steps of `spec` on `threads` threads,
/// with fused kernels compiled (where they can be) or all interpreted; and how many of the
/// step's fused kernels were compiled, of how many.
fn fused_steps(
    spec: &str,
    threads: usize,
    steps: usize,
    interpret: bool,
) -> (Vec<Vec<u8>>, (usize, usize)) {
    let m = ingot_models::by_name(spec).unwrap();
    let c = ingot_compiler::pipeline::compile(&m, &Session::cpu_options()).unwrap();
    let values = seeded_leaves(&c.graph, 7);
    let mut p = PlannedStep::with_threads(cpu_executable(c), threads).unwrap();
    if interpret {
        p.interpret_fused();
    }
    let out = step_bytes(&mut p, &values, steps);
    (out, p.compiled_kernels())
}

/// Two [`fused_steps`] of `spec` on `threads` threads with kernels compiled: the bits `want`
/// (the interpreter's); how many fused kernels were compiled, of how many (printed).
fn compiled_steps_give(want: &[Vec<u8>], spec: &str, threads: usize) -> (usize, usize) {
    let (got, (compiled, fused)) = fused_steps(spec, threads, 2, false);
    assert!(
        got == want,
        "{spec} on {threads} threads: compiled kernels changed the step's bits"
    );
    eprintln!("{spec}: {compiled} of {fused} fused kernels compiled");
    (compiled, fused)
}

#[test]
fn fused_steps_with_compiled_kernels_give_the_interpreters_bits() {
    for spec in [
        "gpt:vocab=256,d_model=64,layers=1,heads=4,d_ff=256,seq=64,batch=8",
        "mlp",
        "cnn",
    ] {
        for threads in [1, 2] {
            let (want, _) = fused_steps(spec, threads, 2, true);
            let (compiled, fused) = compiled_steps_give(&want, spec, threads);
            // Otherwise the comparison says nothing: the step has compiled kernels (a third of
            // the GPT's at least: its layer norms, GELU, softmax rows and optimizer updates).
            assert!(
                compiled > 0,
                "{spec}: none of {fused} fused kernels compiled"
            );
            if spec.starts_with("gpt") {
                assert!(
                    3 * compiled >= fused,
                    "{spec}: {compiled} of {fused} compiled"
                );
            }
        }
    }
}

#[test]
fn a_resnets_batch_norms_compiled_and_cut_into_channels_give_the_interpreters_bits_on_1_and_3_threads(
) {
    // Its batch norms reduce [N, C, H, W] over [0, 2, 3] (the channels kept between reduced
    // axes) and store full outputs: compiled, and on 3 threads cut into ranges of channels.
    let spec = "resnet:depth=18,side=32,batch=4,classes=10";
    let (want, (_, fused)) = fused_steps(spec, 1, 2, true);
    for threads in [1, 3] {
        let (compiled, _) = compiled_steps_give(&want, spec, threads);
        // All but one: the loss's rows, which read the labels as integers.
        assert!(
            compiled + 1 >= fused,
            "{spec}: {compiled} of {fused} fused kernels compiled"
        );
    }
}

#[test]
fn an_in_place_chain_longer_than_a_chunk_computes_the_reference_bits() {
    // 5000 elements: two full chunks and a partial one, each op writing over its operand.
    let mut g = Graph::new();
    let x = g.input("x", [5000], DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    let b = g.mul(a, a).unwrap();
    let c = g.tanh(b).unwrap();
    let d = g.sub(c, a).unwrap_or(c);
    let s = g.sum_all(d).unwrap();
    g.set_output("s", s).unwrap();
    g.set_output("d", d).unwrap();
    let p = plan::plan(&g, &ingot_compiler::lower::Target::Cpu.plan_options()).unwrap();
    let in_place = g
        .ids()
        .filter(|&id| {
            !g.node(id).op.is_leaf()
                && p.liveness.storages[p.liveness.storage_of[id.index()]].owner != id
        })
        .count();
    assert!(in_place >= 2, "the chain should run in place");
    let xs: Vec<f32> = (0..5000).map(|i| (i as f32 * 0.001).sin()).collect();
    let mut l = IndexMap::new();
    l.insert("x".to_string(), Tensor::from_f32([5000], xs));
    let want = run_graph(&g, &l).unwrap();
    let mut planned = PlannedStep::from_plan(g, p).unwrap();
    planned.write_leaf("x", &l["x"]).unwrap();
    planned.step().unwrap();
    for name in ["s", "d"] {
        assert!(
            same_bits(&planned.read_output(name).unwrap(), &want.outputs[name]),
            "output {name} differs"
        );
    }
}

#[test]
fn a_corrupted_plan_is_refused_before_it_becomes_an_executable() {
    let m = ingot_models::mlp_with(4, DType::F32).unwrap();
    let step = training_step(&m.graph, &m.optimizer).unwrap();
    let mut p = plan::plan(
        &step.graph,
        &ingot_compiler::lower::Target::Cpu.plan_options(),
    )
    .unwrap();
    // Move every slab storage onto offset of the first: live values now collide.
    let first = p.slab_base;
    for (i, s) in p.liveness.storages.iter().enumerate() {
        if s.region == ingot_compiler::plan::Region::Slab {
            p.storage_offset[i] = first;
        }
    }
    // Nothing can run a plan that is not an executable, and lowering validates it.
    let err = ingot_compiler::exe::Executable::from_plan(
        "step",
        step.graph,
        p,
        ingot_compiler::lower::Target::Cpu,
    )
    .expect_err("a colliding plan must be refused");
    // Some value is read after another took its bytes, or an op writes over what it reads.
    assert!(
        matches!(
            err,
            LowerError::Plan(
                PlanViolation::ReadAfterOverwrite { .. } | PlanViolation::WritesOverOperand { .. }
            )
        ),
        "{err:?}"
    );
}

#[test]
fn writing_a_leaf_of_the_wrong_type_names_it() {
    let m = ingot_models::mlp_with(4, DType::F32).unwrap();
    let step = training_step(&m.graph, &m.optimizer).unwrap();
    let p = plan::plan(
        &step.graph,
        &ingot_compiler::lower::Target::Cpu.plan_options(),
    )
    .unwrap();
    let mut planned = PlannedStep::from_plan(step.graph, p).unwrap();
    let err = planned
        .write_leaf("fc1.weight", &Tensor::from_f32([2], vec![0.0, 1.0]))
        .unwrap_err();
    assert!(err.to_string().contains("fc1.weight"), "{err}");
    assert!(planned
        .write_leaf("nope", &Tensor::from_f32([1], vec![0.0]))
        .unwrap_err()
        .to_string()
        .contains("nope"));
}
