//! Graphs much deeper than the reference models: every pass walks them with loops and explicit
//! stacks, never with a recursion as deep as the graph, so a 12,000-op chain compiles on a small
//! stack (issue 14, section 2).

use ingot_compiler::autodiff::training_step;
use ingot_compiler::fuse::{concat, remat, select, FuseOptions};
use ingot_compiler::model::Model;
use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::plan::PlanOptions;
use ingot_compiler::rewrite::{self, RewriteOptions};

/// Ops in the chain: the 12,000 (a recursion per op overflowed an 8 MiB stack).
const OPS: usize = 12_000;

/// A stack far smaller than the main thread's 8 MiB, so a recursion per op would overflow it.
const STACK: usize = 1 << 20;

/// The IR text of a chain of `n` elementwise ops over one parameter (as scripts/chain_ir.py
/// writes it): alternately a product with the parameter and a tanh, summed into the loss.
fn chain(n: usize) -> String {
    let mut t = String::from(
        "ingot-ir 1\n%0 = parameter \"w\" init=normal(0.5) : f32[16]\n%1 = input \"x\" : f32[16]\n",
    );
    for i in 0..n {
        let (node, prev) = (i + 2, i + 1);
        if i % 2 == 0 {
            t += &format!("%{node} = mul(%{prev}, %0) : f32[16]\n");
        } else {
            t += &format!("%{node} = tanh(%{prev}) : f32[16]\n");
        }
    }
    let last = n + 1;
    t += &format!(
        "%{} = reduce_sum(%{last}) axes=[0] : f32[1]\n%{} = reshape(%{}) : f32[]\noutput \"loss\" = %{}\n",
        n + 2,
        n + 3,
        n + 2,
        n + 3
    );
    t
}

fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("spawn")
        .join()
        .expect("the work finished without overflowing the stack")
}

#[test]
fn a_12000_op_chain_is_traced_differentiated_rewritten_prepared_for_fusion_and_planned_on_a_1_mib_stack(
) {
    let (ops, slab, load, remat_ok, materialized) = on_small_stack(|| {
        let model = Model::from_ir_text("chain", &chain(OPS)).expect("the chain parses");
        let step = training_step(&model.graph, &model.optimizer).expect("autodiff");
        let (g, _) = rewrite::simplify(&step.graph, &RewriteOptions::default()).expect("rewrite");
        // Fusion's passes up to lowering (lowering's own recursion is fixed separately).
        let (g2, _) = concat::as_selects(&g).expect("concat");
        let opts = FuseOptions::default();
        let (g3, _) = remat::recompute_for_backward(&g2, opts.recompute_ops).expect("remat");
        let mut mat = select::forced(&g3);
        select::shared(&g3, &mut mat, opts.recompute_ops);
        // Scheduling, liveness, offsets, validation and the report, on the unfused step.
        let c = pipeline::compile(&model, &Options::unoptimized(PlanOptions::default()))
            .expect("the unfused chain plans");
        (
            c.report.ops,
            c.plan.slab_bytes,
            c.plan.load_bytes,
            g3.verify().is_ok(),
            mat.iter().filter(|&&m| m).count(),
        )
    });
    assert!(ops > 2 * OPS, "forward and backward: {ops} ops");
    assert!(remat_ok);
    assert!(materialized >= 3, "{materialized} values materialized");
    assert!(slab >= load && load > 0, "slab {slab}, LOAD {load}");
}

/// The whole pipeline, fusion's lowering included (its `expand` walks with an explicit stack),
/// on a 1 MiB stack.
#[test]
fn a_12000_op_chain_compiles_end_to_end_on_a_1_mib_stack() {
    let (slab, load) = on_small_stack(|| {
        let model = Model::from_ir_text("chain", &chain(OPS)).expect("the chain parses");
        let c = pipeline::compile(&model, &Options::default()).expect("the chain compiles");
        (c.plan.slab_bytes, c.plan.load_bytes)
    });
    assert_eq!(slab, load, "a chain's plan is at its lower bound");
}
