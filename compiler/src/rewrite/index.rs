//! The e-classes a rule can match, found without visiting the others.
//!
//! Every rule ([`super::rules`]) looks at one e-class and matches only an e-node of a few
//! kinds there (`x * 1` a multiplication, `transpose(transpose(x))` a transpose), or, for
//! constant folding, only a class of known constant value. egg has each rule search every
//! class, in id order: with thirty rules, that was thirty sorts of the class ids and thirty
//! lookups of every class in egg's class table per iteration: half of the rewrite's
//! instructions on a deep step, and random reads of a table of hundreds of thousands of
//! classes. The [`ClassIndex`] lists the classes in id order once per iteration,
//! each with the [`Kind::tag`]s of its e-nodes; a rule walks that list and looks up only the
//! classes holding one of its [`Rule::roots`](super::rules::Rule). The matches, and their order,
//! are those of searching every class: a class skipped is one in which the rule finds nothing
//! (`rewrite::tests` checks each rule's roots against every class of mlp, a small GPT and cnn).

pub use super::analysis::ClassIndex;

use super::analysis::{Data, EGraph};
use super::lang::ENode;
#[cfg(doc)]
use super::lang::Kind;
use egg::Id;

/// The bit of a class whose value is a known constant (no [`Kind::tag`] uses it).
pub const CONSTANT: u64 = 1 << 63;

/// The bits of one class: its e-nodes' tags, and [`CONSTANT`] for a known constant.
pub fn class_bits(class: &egg::EClass<ENode, Data>) -> u64 {
    let nodes = class.nodes.iter().fold(0, |m, n| m | n.kind.tag());
    nodes
        | if class.data.constant.is_some() {
            CONSTANT
        } else {
            0
        }
}

/// What changes whenever `eg` does, read without visiting its classes: its class count, which
/// every union lowers, and the length of its list of added e-nodes, which every new e-node
/// lengthens and nothing shortens. (egg's `total_number_of_nodes`, used before, walks the
/// whole class table, and every rule's search asked for it: a pass over every class per rule
/// and iteration, tens of megabytes at 200 layers of a narrow GPT, issue 53.)
fn fingerprint(eg: &EGraph) -> (usize, usize) {
    (eg.number_of_classes(), eg.nodes().len())
}

impl ClassIndex {
    /// Indexes `eg` (clean: rebuilt since its last change); stored in its analysis.
    pub fn build(eg: &mut EGraph) {
        let mut classes: Vec<(Id, u64)> = eg.classes().map(|c| (c.id, class_bits(c))).collect();
        classes.sort_unstable_by_key(|&(id, _)| id);
        let built_for = fingerprint(eg);
        eg.analysis.index = ClassIndex { classes, built_for };
    }

    /// The ids of the classes of `eg` holding any of `roots`' bits, in id order: from the index
    /// when it was built for this e-graph, else from every class.
    pub fn matching(eg: &EGraph, roots: u64) -> Vec<Id> {
        let index = &eg.analysis.index;
        if index.built_for == fingerprint(eg) {
            return (index.classes.iter())
                .filter(|&&(_, bits)| bits & roots != 0)
                .map(|&(id, _)| id)
                .collect();
        }
        let mut ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
        ids.sort_unstable();
        ids
    }
}
