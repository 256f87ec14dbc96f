//! The largest tensors of a transformer step never reach memory more than once: the
//! `[tokens, vocab]` logits are one buffer in the whole step (the softmax cross-entropy's
//! probabilities are never stored, and the logits' gradient is written over the logits), for
//! the CUDA plan of gpt2 in each precision.

use ingot_compiler::ir::{Graph, NodeId};
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Compiled, Options};
use ingot_compiler::precision::Precision;

fn gpt2(precision: Precision) -> Compiled {
    let m = ingot_models::by_name("gpt2").unwrap();
    let opts = Options {
        precision: Some(precision),
        ..Options::for_target(Target::Cuda)
    };
    pipeline::compile(&m, &opts).unwrap()
}

/// The distinct storages (buffers of the plan) holding values shaped `dims`.
fn storages_shaped(c: &Compiled, dims: &[usize]) -> Vec<usize> {
    let g: &Graph = &c.graph;
    let mut out: Vec<usize> = g
        .ids()
        .filter(|&id: &NodeId| g.ty(id).shape.dims() == dims && !g.node(id).op.is_leaf())
        .map(|id| c.plan.liveness.storage_of[id.index()])
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[test]
fn gpt2s_logits_and_their_gradient_share_one_buffer_and_no_probabilities_are_stored() {
    for p in [Precision::F32, Precision::Bf16] {
        let c = gpt2(p);
        let logits = storages_shaped(&c, &[8192, 50304]);
        assert_eq!(logits.len(), 1, "{p}: buffers of [8192, 50304]: {logits:?}");
        let values = c
            .graph
            .ids()
            .filter(|&id| c.graph.ty(id).shape.dims() == [8192, 50304])
            .count();
        assert!(
            values >= 2,
            "{p}: the logits and their gradient are both values of the step"
        );
    }
}
