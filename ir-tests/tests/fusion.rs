//! The rewritten and fused step computes what the primitive ops compute: fused and unfused CPU
//! steps agree within 1e-5 relative on every test model, the fused graph's planned run is bit
//! identical to its unplanned reference run, and fusion makes fewer kernels and smaller plans.

use indexmap::IndexMap;
use ingot_compiler::autodiff::Optimizer;
use ingot_compiler::ir::{LeafKind, Op};
use ingot_compiler::pipeline::{self, Options};
use ingot_ir_tests::planned::{assert_planned_step_is_reference, seeded_leaves};
use ingot_runtime::cpu::run_graph;
use ingot_runtime::tensor::{Data, Tensor};
use ingot_trainer::session::Session;

const SMALL_GPT: &str = "gpt:vocab=96,d_model=32,layers=2,heads=4,d_ff=64,seq=16,batch=3";

/// Largest difference over the tensor, relative to its largest magnitude.
fn rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    a.iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Runs `steps` steps fused and unfused from the same seed; every loss, and every parameter
/// (with SGD) or optimizer moment (with AdamW) after the last step must agree within `tol`
/// (relative to the tensor's largest magnitude).
///
/// AdamW's parameters are not compared: a gradient that is zero in exact arithmetic (the key
/// bias of attention, which softmax cancels) is rounding noise in both steps, and AdamW divides
/// it by its own magnitude, so the noise's sign moves the parameter by a full learning rate.
/// The moments carry the gradients without that amplification.
fn fused_matches_unfused(m: &ingot_compiler::model::Model, steps: usize, tol: f64) {
    let spec = &m.name;
    let mut fused = Session::new(m, 3).unwrap();
    let unopt = Options::unoptimized(ingot_compiler::lower::Target::Cpu.plan_options());
    let mut plain = Session::with_options(m, 3, &unopt).unwrap();
    for s in 0..steps {
        let (a, b) = (fused.step().unwrap().loss, plain.step().unwrap().loss);
        assert!(
            (a - b).abs() <= tol * b.abs(),
            "{spec} step {s}: fused loss {a}, unfused {b}"
        );
    }
    if matches!(m.optimizer, Optimizer::Sgd { .. }) {
        let (pa, pb) = (fused.parameters(), plain.parameters());
        assert_eq!(pa.len(), pb.len());
        for (name, b) in &pb {
            let d = rel_diff(&pa[name], b);
            assert!(d <= tol, "{spec}: parameter {name} differs by {d:e}");
        }
    }
    let (sa, sb) = (fused.optimizer_state(), plain.optimizer_state());
    for (name, b) in &sb {
        let d = rel_diff(&sa[name], b);
        assert!(d <= tol, "{spec}: optimizer state {name} differs by {d:e}");
    }
}

#[test]
fn fused_mlp_steps_match_the_unfused_ones() {
    fused_matches_unfused(&ingot_models::by_name("mlp").unwrap(), 3, 1e-5);
}

#[test]
fn fused_gpt_steps_match_the_unfused_ones_with_adamw_and_with_sgd() {
    let adamw = ingot_models::by_name(SMALL_GPT).unwrap();
    fused_matches_unfused(&adamw, 3, 1e-5);
    let sgd = ingot_compiler::model::Model {
        optimizer: Optimizer::Sgd { lr: 0.1 },
        ..adamw
    };
    fused_matches_unfused(&sgd, 3, 1e-5);
}

#[test]
fn a_fused_planned_step_is_bit_identical_to_its_reference_run() {
    let m = ingot_models::by_name(SMALL_GPT).unwrap();
    let c = pipeline::compile(&m, &Session::cpu_options()).unwrap();
    let g = c.graph.clone();
    assert!(g.ids().any(|id| matches!(g.node(id).op, Op::Fused(_))));
    assert!(g.ids().any(|id| matches!(g.node(id).op, Op::Result { .. })));
    assert_planned_step_is_reference(&c, &seeded_leaves(&g, 5));
}

#[test]
fn fusion_cuts_kernels_and_memory_on_every_reference_model() {
    for spec in ["mlp", "gpt-mini", SMALL_GPT] {
        let cpu = ingot_compiler::lower::Target::Cpu.plan_options();
        let before = ingot_models::compile_model(spec, &Options::unoptimized(cpu.clone())).unwrap();
        let after = ingot_models::compile_model(spec, &Session::cpu_options()).unwrap();
        assert!(
            after.report.kernels * 3 < before.report.kernels,
            "{spec}: {} kernels fused vs {} unfused",
            after.report.kernels,
            before.report.kernels
        );
        assert!(
            after.plan.total_bytes < before.plan.total_bytes,
            "{spec}: fused plan {} vs unfused {}",
            after.plan.total_bytes,
            before.plan.total_bytes
        );
    }
}

#[test]
fn matmuls_read_weights_in_place_instead_of_materializing_their_transposes() {
    let c = ingot_models::compile_model("mlp", &Session::cpu_options()).unwrap();
    let g = &c.graph;
    assert!(
        !g.ids()
            .any(|id| matches!(g.node(id).op, Op::Transpose { .. })),
        "no transpose op survives fusion"
    );
    // Every weight is read by a matmul directly, transposed by a flag.
    for w in g.leaves(LeafKind::Parameter) {
        if g.ty(w).shape.rank() == 2 {
            assert!(g.ids().any(|id| {
                matches!(g.node(id).op, Op::MatMul { tb: true, .. }) && g.node(id).inputs[1] == w
            }));
        }
    }
}

#[test]
fn fusion_is_deterministic() {
    let a = ingot_models::compile_model(SMALL_GPT, &Session::cpu_options()).unwrap();
    let b = ingot_models::compile_model(SMALL_GPT, &Session::cpu_options()).unwrap();
    assert_eq!(
        ingot_compiler::ir::text::print(&a.graph),
        ingot_compiler::ir::text::print(&b.graph)
    );
    assert_eq!(a.plan.storage_offset, b.plan.storage_offset);
}

#[test]
fn the_qkv_gradient_is_written_packed_by_the_attention_backward_with_no_join() {
    let m = ingot_models::by_name(SMALL_GPT).unwrap();
    let c = pipeline::compile(&m, &Session::cpu_options()).unwrap();
    let g = &c.graph;
    assert!(
        !g.ids().any(|id| matches!(g.node(id).op, Op::Concat { .. })),
        "no concat survives fusion"
    );
    assert_eq!(c.fuse.as_ref().unwrap().concats_fused, 0, "nothing to join");
    // Each layer's attention backward writes the gradient of the whole projection, [batch,
    // seq, 3, heads, head_dim] (batch 3, seq 16, heads 4, head_dim 8), and the projection's
    // weight gradient reads it as it is: no kernel copies it into that layout.
    let grads: Vec<_> = g
        .ids()
        .filter(|&id| matches!(g.node(id).op, Op::AttentionGrad { .. }))
        .collect();
    assert_eq!(grads.len(), 2, "one per layer");
    let users = g.users();
    for d in grads {
        assert_eq!(g.ty(d).shape.dims(), [3, 16, 3, 4, 8]);
        let through_views = |x: ingot_compiler::ir::NodeId| -> Vec<ingot_compiler::ir::NodeId> {
            let mut at = vec![x];
            let mut found = Vec::new();
            while let Some(y) = at.pop() {
                for &u in &users[y.index()] {
                    match g.node(u).op {
                        Op::Reshape => at.push(u),
                        _ => found.push(u),
                    }
                }
            }
            found
        };
        assert!(
            through_views(d)
                .iter()
                .any(|&u| matches!(g.node(u).op, Op::MatMul { .. } | Op::MatMulAcc { .. })),
            "the weight gradient reads the attention's gradient in place"
        );
        assert!(!g
            .ids()
            .any(|id| matches!(&g.node(id).op, Op::Fused(k) if k.domain == [3, 16, 3, 4, 8])));
    }
}

#[test]
fn a_concat_written_as_selects_gives_the_concat_bit_for_bit() {
    use ingot_compiler::ir::{DType, Graph};
    // Three parts seen through transposes (as the heads' gradients are), values including
    // -0.0, NaN and infinities, which a select must pass through untouched.
    let mut g = Graph::new();
    let mut parts = Vec::new();
    let mut leaves: IndexMap<String, Tensor> = IndexMap::new();
    for p in 0..3 {
        let name = format!("x{p}");
        let x = g.input(&name, &[2usize, 4, 3, 5][..], DType::F32).unwrap();
        let t = g.transpose(x, &[0, 2, 1, 3]).unwrap();
        parts.push(g.reshape(t, &[2usize, 3, 20][..]).unwrap());
        let specials = [-0.0f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        let values = (0..120)
            .map(|i| {
                if i % 7 == p {
                    specials[(i / 7) % 4]
                } else {
                    (i as f32 * 0.37 + p as f32).sin()
                }
            })
            .collect();
        leaves.insert(name, Tensor::from_f32(&[2usize, 4, 3, 5][..], values));
    }
    let c = g.concat(&parts, 2).unwrap();
    g.set_output("y", c).unwrap();
    let (s, n) = ingot_compiler::fuse::concat::as_selects(&g).unwrap();
    assert_eq!(n, 1);
    let (want, got) = (
        run_graph(&g, &leaves).unwrap().outputs["y"].clone(),
        run_graph(&s, &leaves).unwrap().outputs["y"].clone(),
    );
    let bits = |t: &Tensor| match &t.data {
        Data::F32(v) => v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(bits(&want), bits(&got));
}

#[test]
fn a_deep_chain_of_row_reductions_fuses_into_kernels_of_bounded_reductions_that_train_as_unfused() {
    use ingot_compiler::fuse::MAX_KERNEL_REDUCTIONS;
    // 60 centred layers: one kernel holding them all would evaluate its body 60 times per row
    // and keep 60 passes of bookkeeping for every instruction.
    let text = ingot_ir_tests::chains::reduce_chain(60, 4, 8);
    let m = ingot_compiler::model::Model::from_ir_text("reduce-chain", &text).unwrap();
    let c = pipeline::compile(&m, &Session::cpu_options()).unwrap();
    let mut most = 0;
    for id in c.graph.ids() {
        if let Op::Fused(k) = &c.graph.node(id).op {
            most = most.max(k.reductions());
        }
    }
    assert!(
        most > 1 && most <= MAX_KERNEL_REDUCTIONS,
        "the largest kernel holds {most} reductions"
    );
    fused_matches_unfused(&m, 3, 1e-5);
}
