//! Provenance: where a node came from, in the user's words.
//!
//! A node's [`Origin`] names the layer of the model that made it (the nn helper's scope, such as
//! `blocks.3.attn.qkv`), the line of a model file (`step.ir:12`), a leaf's own name, the backward
//! pass of a layer (`blocks.3.attn.qkv (backward)`) or the optimizer's update of a parameter
//! (`update of blocks.3.attn.qkv.weight`). Passes that rebuild the graph keep it: the rewriter
//! gives an extracted node the sources of its e-class, fusion gives a kernel the sources of the
//! nodes it fused (deduplicated, in order), rematerialization names a copy after what it
//! recomputes (`blocks.3.gelu (recomputed)`); a node a pass creates from nothing takes the
//! origin of its first user that has one ([`fill_missing`]). Reports, the plan page and errors
//! name buffers by it first and by node id second, since node ids change with every pass and
//! every compiler version; the memory report also tells gradients (what autodiff made) from
//! other values of the backward pass by it (`report::storage_kinds`).
//!
//! An origin is debug information, like a source location: it takes no part in a graph's
//! equality (two graphs computing the same thing are equal wherever their nodes came from), and
//! the IR text form prints it only when asked ([`print_with_origins`]).

pub(super) mod sources;

pub use sources::{Origin, MAX_SOURCES};

/// The IR text form of `g` ([`super::text::print`]) with each node's origin as a comment at
/// the end of its line (`# blocks.3.qkv`); it parses back to the same graph.
pub fn print_with_origins(g: &super::graph::Graph) -> String {
    let text = super::text::print(g);
    let mut out = String::with_capacity(text.len() + 24 * g.len());
    // Line 0 is the header; lines 1..=len are the nodes, in order.
    for (i, line) in text.lines().enumerate() {
        out.push_str(line);
        if (1..=g.len()).contains(&i) {
            let o = g.origin(super::graph::NodeId(i as u32 - 1));
            if !o.is_empty() {
                let clean: String = o
                    .label()
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                out.push_str("  # ");
                out.push_str(&clean);
            }
        }
        out.push('\n');
    }
    out
}

/// Gives every node of `g` without an origin one from its neighbours: the first user that has
/// one (a node a rewrite created belongs to the layer it serves), else the first operand that
/// has one. Deterministic: users are visited from the last node back, operands in order.
pub fn fill_missing(g: &mut super::graph::Graph) {
    let n = g.len();
    // Users first, from the end (so a chain of new nodes takes its consumer's origin).
    let users = g.users();
    for i in (0..n).rev() {
        let id = super::graph::NodeId(i as u32);
        if !g.origin(id).is_empty() {
            continue;
        }
        if let Some(o) = users[i]
            .iter()
            .map(|&u| g.origin(u))
            .find(|o| !o.is_empty())
            .cloned()
        {
            g.set_origin(id, o);
        }
    }
    for i in 0..n {
        let id = super::graph::NodeId(i as u32);
        if !g.origin(id).is_empty() {
            continue;
        }
        let from = g
            .node(id)
            .inputs
            .iter()
            .map(|&x| g.origin(x))
            .find(|o| !o.is_empty())
            .cloned();
        if let Some(o) = from {
            g.set_origin(id, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_first_occurrences_in_order_without_duplicates() {
        let a = Origin::new("blocks.0.fc");
        let b = Origin::merge([&Origin::new("blocks.0.ln2"), &a]);
        let m = Origin::merge([&a, &Origin::none(), &b, &a]);
        assert_eq!(m.label(), "blocks.0.fc, blocks.0.ln2");
        assert_eq!(Origin::merge([&Origin::none()]), Origin::none());
    }

    #[test]
    fn merging_caps_the_number_of_sources() {
        let many: Vec<Origin> = (0..20).map(|i| Origin::new(&format!("l{i}"))).collect();
        let m = Origin::merge(&many);
        assert_eq!(m.sources().len(), MAX_SOURCES);
        assert_eq!(m.primary(), Some("l0"));
    }

    use crate::ir::{Graph, NodeId};
    use crate::pipeline::Options;

    const SMALL_GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";

    fn labels(g: &Graph) -> Vec<String> {
        g.ids().map(|id| g.origin(id).label()).collect()
    }

    #[test]
    fn every_node_of_a_compiled_gpt_keeps_a_layer_through_autodiff_rewrite_and_fusion() {
        let c = crate::models::compile_model(SMALL_GPT, &Options::default()).unwrap();
        let g = &c.graph;
        for id in g.ids() {
            assert!(
                !g.origin(id).is_empty(),
                "{id} ({}) has no origin",
                g.node(id).op.name()
            );
        }
        let primaries: std::collections::BTreeSet<&str> =
            g.ids().filter_map(|id| g.origin(id).primary()).collect();
        for want in [
            "blocks.0.qkv",
            "blocks.1.attn",
            "blocks.0.qkv (backward)",
            "blocks.1.attn (backward)",
            "update of blocks.0.qkv.weight",
            "wte.weight",
            "loss",
        ] {
            assert!(
                primaries.contains(want),
                "{want} missing from {primaries:?}"
            );
        }
        // A fused kernel lists the sources it fused, more than one for some.
        let fused_many = g.ids().any(|id| {
            matches!(g.node(id).op, crate::ir::Op::Fused(_)) && g.origin(id).sources().len() > 1
        });
        assert!(fused_many);
    }

    #[test]
    fn provenance_is_the_same_on_every_compile() {
        let a = crate::models::compile_model(SMALL_GPT, &Options::default()).unwrap();
        let b = crate::models::compile_model(SMALL_GPT, &Options::default()).unwrap();
        assert_eq!(labels(&a.graph), labels(&b.graph));
    }

    #[test]
    fn autodiff_names_each_backward_node_after_its_forward_layer_and_the_update_after_its_parameter(
    ) {
        let m = crate::models::by_name("mlp").unwrap();
        let step = crate::autodiff::training_step(&m.graph, &m.optimizer).unwrap();
        let g = &step.graph;
        for i in step.phases.backward.clone() {
            let o = g.origin(NodeId(i as u32)).label();
            assert!(o.ends_with(" (backward)"), "backward node %{i} is {o:?}");
        }
        for u in &g.updates {
            let name = g.leaf_name(u.target).unwrap();
            assert_eq!(g.origin(u.value).label(), format!("update of {name}"));
        }
    }

    #[test]
    fn a_model_files_nodes_come_from_their_lines() {
        let text = "ingot-ir 1\n\
                    %0 = parameter \"w\" init=ones : f32[4]\n\
                    # a comment line\n\
                    %1 = reduce_sum(%0) axes=[0] : f32[1]\n\
                    %2 = reshape(%1) : f32[]\n\
                    output \"loss\" = %2\n";
        let m = crate::model::Model::from_ir_text("step.ir", text).unwrap();
        assert_eq!(m.graph.origin(NodeId(0)).label(), "w");
        assert_eq!(m.graph.origin(NodeId(1)).label(), "step.ir:4");
        assert_eq!(m.graph.origin(NodeId(2)).label(), "step.ir:5");
    }

    #[test]
    fn the_text_form_prints_origins_only_when_asked_and_they_take_no_part_in_equality() {
        let m = crate::models::by_name("mlp").unwrap();
        let plain = super::super::text::print(&m.graph);
        assert!(!plain.contains('#'), "the plain text form is unchanged");
        let with = print_with_origins(&m.graph);
        assert!(with.contains("  # fc1"), "{with}");
        let back = super::super::text::parse(&with).unwrap();
        assert_eq!(
            back, m.graph,
            "origins are comments, and equality ignores them"
        );
        assert_eq!(super::super::text::print(&back), plain);
    }

    #[test]
    fn the_backward_of_a_backward_origin_is_not_suffixed_twice() {
        let o = Origin::new("blocks.3.qkv").backward();
        assert_eq!(o.label(), "blocks.3.qkv (backward)");
        assert_eq!(o.backward(), o);
    }
}
