//! Late slices copied early ([`ingot_compiler::fuse::early`]): a skip connection, in miniature.
//! `a = tanh(x · Wa)` is concatenated with the end of a deep chain that starts from it, and
//! the concat feeds the output projection. In the backward pass the concat's gradient (a
//! library call's output, so stored) is sliced twice: the chain's part is read at once, the
//! skip's part only when the chain's gradient has come back down to `a`. Copied out early, the
//! skip's slice frees the whole gradient at once; the losses stay the same to the bit.

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::fuse::{self, early, select, FuseOptions};
use ingot_compiler::ir::{text, Graph, NodeId, Op};
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline::{self, Compiled, Options};
use ingot_ir_tests::losses::cpu_loss_bits;

/// The skip model with `layers` tanh layers (width 64) between `a` (width 32) and the concat.
fn skip_model(layers: usize) -> Model {
    let mut t = String::from("ingot-ir 1\n");
    t += "%0 = input \"x\" : f32[64,32]\n%1 = input \"y\" : f32[64,16]\n";
    t += "%2 = parameter \"wa\" init=normal(0.2) : f32[32,32]\n";
    t += "%3 = parameter \"up\" init=normal(0.2) : f32[32,64]\n";
    t += "%4 = parameter \"out\" init=normal(0.1) : f32[96,16]\n";
    t += "%5 = matmul(%0, %2) : f32[64,32]\n%6 = tanh(%5) : f32[64,32]\n";
    t += "%7 = matmul(%6, %3) : f32[64,64]\n";
    let mut h = 7;
    let mut n = 8;
    for i in 0..layers {
        t += &format!("%{n} = parameter \"w{i}\" init=normal(0.15) : f32[64,64]\n");
        t += &format!("%{} = matmul(%{h}, %{n}) : f32[64,64]\n", n + 1);
        t += &format!("%{} = tanh(%{}) : f32[64,64]\n", n + 2, n + 1);
        h = n + 2;
        n += 3;
    }
    t += &format!("%{n} = concat(%{h}, %6) axis=1 : f32[64,96]\n");
    t += &format!("%{} = matmul(%{n}, %4) : f32[64,16]\n", n + 1);
    t += &format!("%{} = sub(%{}, %1) : f32[64,16]\n", n + 2, n + 1);
    t += &format!("%{} = mul(%{}, %{}) : f32[64,16]\n", n + 3, n + 2, n + 2);
    t += &format!(
        "%{} = reduce_sum(%{}) axes=[0,1] : f32[1,1]\n",
        n + 4,
        n + 3
    );
    t += &format!("%{} = reshape(%{}) : f32[]\n", n + 5, n + 4);
    t += &format!("%{} = full value=0.0009765625 : f32[]\n", n + 6);
    t += &format!("%{} = mul(%{}, %{}) : f32[]\n", n + 7, n + 5, n + 6);
    t += &format!("output \"loss\" = %{}\n", n + 7);
    Model::from_ir_text("skip.ir", &t).unwrap()
}

fn compiled(m: &Model, early_slices: bool) -> Compiled {
    let opts = Options {
        fuse: Some(FuseOptions {
            early_slices,
            ..FuseOptions::default()
        }),
        ..Options::for_target(Target::Cpu)
    };
    pipeline::compile(m, &opts).unwrap()
}

/// The slices fusion copies early in `m`'s step (shapes), as fusion sees its graph.
fn early_slice_shapes(m: &Model) -> Vec<String> {
    let opts = Options::for_target(Target::Cpu);
    let r = pipeline::rewritten(m, &StepOptions::default(), &opts).unwrap();
    let g = fuse::prepared(&r.graph).unwrap();
    early::early_slices(&g, &select::forced(&g))
        .iter()
        .map(|&s| g.ty(s).to_string())
        .collect()
}

/// The stored gradient of the concat: the library call writing f32[64,96] in the backward pass.
fn concat_gradient(g: &Graph) -> NodeId {
    let found: Vec<NodeId> = g
        .ids()
        .filter(|&id| {
            matches!(g.node(id).op, Op::MatMul { .. }) && g.ty(id).to_string() == "f32[64,96]"
        })
        .collect();
    assert_eq!(found.len(), 1, "one product writes the concat's gradient");
    found[0]
}

/// The last position the storage of `id` is live at, and the number of positions.
fn storage_end(c: &Compiled, id: NodeId) -> (usize, usize) {
    let l = &c.plan.liveness;
    (l.storages[l.storage_of[id.index()]].end, l.order.len())
}

#[test]
fn a_skip_slice_read_at_the_end_of_the_backward_pass_is_copied_early() {
    let m = skip_model(16);
    assert_eq!(
        early_slice_shapes(&m),
        ["f32[64,32]"],
        "the skip's slice, a third of the gradient"
    );
    let (with, without) = (compiled(&m, true), compiled(&m, false));
    for c in [&with, &without] {
        c.plan.validate(&c.graph).unwrap();
    }
    let (end_with, n) = storage_end(&with, concat_gradient(&with.graph));
    let (end_without, _) = storage_end(&without, concat_gradient(&without.graph));
    // Without the copy the whole gradient lives until the skip's part is added, at the end of
    // the chain's backward pass; with it, it dies where the chain's part is read.
    assert!(
        end_with + 16 <= end_without,
        "the concat's gradient dies at {end_with} with the copy, {end_without} without ({n} positions)"
    );
    assert_eq!(
        with.fuse.as_ref().unwrap().kernels,
        without.fuse.as_ref().unwrap().kernels + 1,
        "the copy is one kernel of its own"
    );
}

#[test]
fn copying_a_slice_early_changes_no_loss_to_the_bit() {
    let m = skip_model(16);
    let with = cpu_loss_bits(&compiled(&m, true), 7, 3);
    let without = cpu_loss_bits(&compiled(&m, false), 7, 3);
    assert_eq!(with, without);
}

#[test]
fn a_slice_read_soon_after_the_rest_of_its_value_is_left_inlined() {
    // Two layers: the skip's part is read a few nodes after the chain's, under the gap.
    let m = skip_model(2);
    assert!(early_slice_shapes(&m).is_empty());
    let (with, without) = (compiled(&m, true), compiled(&m, false));
    assert_eq!(text::print(&with.graph), text::print(&without.graph));
    assert_eq!(with.plan.total_bytes, without.plan.total_bytes);
}
