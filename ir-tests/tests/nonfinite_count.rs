//! The update's non-finite count (`StepOptions::count_nonfinite`) as fusion and the planner
//! see it: its first stage inside each update's kernel, cut in one round of lowering however
//! many parameters there are, and plans that grow by a kernel's scratch at most.

use ingot_compiler::autodiff::{StepOptions, NONFINITE};
use ingot_compiler::ir::{Graph, NodeId, Op};
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Compiled, Options};
use ingot_compiler::precision::Precision;
use ingot_ir_tests::cuda_options;

fn gpt(layers: usize) -> String {
    format!("gpt:vocab=64,d_model=32,layers={layers},heads=4,d_ff=64,seq=8,batch=2")
}

fn compiled(spec: &str, step: StepOptions, opts: &Options) -> Compiled {
    pipeline::compile_observed_with(
        &ingot_models::by_name(spec).unwrap(),
        &step,
        opts,
        &mut |_| {},
    )
    .unwrap()
}

fn counting() -> StepOptions {
    StepOptions {
        count_nonfinite: true,
        ..StepOptions::default()
    }
}

#[test]
fn a_sum_of_reductions_over_every_parameter_is_cut_in_one_round_whatever_the_depth() {
    // Gradient clipping's norm and the non-finite count each add one reduction per parameter
    // (a 2-layer GPT has 28, an 8-layer one 100); lowering finds them in the same round.
    let step = StepOptions {
        clip_grad_norm: Some(1.0),
        ..counting()
    };
    let rounds: Vec<usize> = [2, 8]
        .iter()
        .map(|&l| {
            let c = compiled(&gpt(l), step, &Options::for_target(Target::Cuda));
            c.fuse.unwrap().rounds
        })
        .collect();
    assert_eq!(rounds[0], rounds[1], "rounds of lowering at 2 and 8 layers");
    assert!(rounds[1] <= 4, "{rounds:?}");
}

/// The kernel that writes `v` (a fused node, or a result of one) and the kernel's node.
fn kernel_of(g: &Graph, v: NodeId) -> NodeId {
    match g.node(v).op {
        Op::Result { .. } => g.node(v).inputs[0],
        _ => v,
    }
}

#[test]
fn on_cuda_each_update_kernel_counts_its_rows_and_nothing_reads_a_new_weight_again() {
    for precision in [Precision::F32, Precision::Bf16] {
        let opts = cuda_options(precision);
        let c = compiled(&gpt(2), counting(), &opts);
        let g = &c.graph;
        assert!(g.outputs.contains_key(NONFINITE));
        let params: Vec<NodeId> = g.leaves(ingot_compiler::ir::LeafKind::Parameter);
        let users = g.users();
        for u in g.updates.iter().filter(|u| params.contains(&u.target)) {
            let name = g.leaf_name(u.target).unwrap();
            let k = kernel_of(g, u.value);
            let Op::Fused(kernel) = &g.node(k).op else {
                panic!("{name}: the new value is not a fused kernel's");
            };
            assert!(
                !kernel.reduce_axes.is_empty(),
                "{precision:?} {name}: its update kernel reduces (the count's rows)"
            );
            // The new weight is read by no other kernel: the count took it from registers.
            for &r in &users[u.value.index()] {
                assert!(
                    matches!(g.node(r).op, Op::Result { .. }) || r == k,
                    "{precision:?} {name}: {r} reads the new weight again"
                );
            }
        }
    }
}

/// The count's bytes (a few 256-byte blocks) and, on the CPU, the lane buffers of the few
/// values it adds to each update's kernel (scratch that counts where the peak is in the
/// update, as in small models); at GPT-2's size it moves no plan.
#[test]
fn the_count_adds_at_most_a_kernels_scratch_to_small_plans_and_nothing_to_gpt2s() {
    for spec in ["mlp".to_string(), gpt(2)] {
        for target in [Target::Cpu, Target::Cuda] {
            let opts = Options::for_target(target);
            let with = compiled(&spec, counting(), &opts).plan.total_bytes;
            let without = compiled(&spec, StepOptions::default(), &opts)
                .plan
                .total_bytes;
            eprintln!("{spec} on {target}: {without} -> {with} bytes");
            assert!(
                with <= without + 16 * 1024,
                "{spec} on {target}: {without} bytes without the count, {with} with it"
            );
        }
    }
    let opts = Options {
        precision: Some(Precision::Bf16),
        ..Options::for_target(Target::Cuda)
    };
    let with = compiled("gpt2", counting(), &opts).plan.total_bytes;
    let without = compiled("gpt2", StepOptions::default(), &opts)
        .plan
        .total_bytes;
    assert_eq!(with, without, "gpt2 in bf16 on CUDA");
}
