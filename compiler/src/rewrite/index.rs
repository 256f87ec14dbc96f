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
//! classes holding one of its [`Rule::roots`](super::rules::Rule). A rule that looks through an
//! operand (`x * 1` needs an operand of known value, `neg(neg(x))` a negation below) also names
//! what that operand's class must hold ([`Rule::operands`](super::rules::Rule)), and the index
//! lists each class with the bits of the classes its e-nodes read, so that the rule passes by
//! the classes whose operands hold none of them (a deep step's additions and products, nearly
//! all of which have no constant or negated operand: the search's lookups in egg's table grew
//! tenfold from 50 to 200 layers of a narrow GPT, issue 53). The matches, and their order,
//! are those of searching every class: a class skipped is one in which the rule finds nothing
//! (`rewrite::tests` checks each rule's roots and operands against every class of mlp, a small
//! GPT and cnn).

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
    /// Indexes `eg` (clean: rebuilt since its last change); stored in its analysis. Each class
    /// is listed with its own bits and its operands' bits: the union of [`class_bits`] over
    /// the classes its e-nodes read.
    pub fn build(eg: &mut EGraph) {
        let mut classes: Vec<(Id, u64, u64)> =
            eg.classes().map(|c| (c.id, class_bits(c), 0)).collect();
        classes.sort_unstable_by_key(|&(id, ..)| id);
        // Bits and operand bits by class id, read in passes over the class table in its own
        // order (not one lookup of egg's table per class or operand).
        let slots = classes.last().map_or(0, |&(id, ..)| usize::from(id) + 1);
        let mut bits_of = vec![0u64; slots];
        for &(id, bits, _) in &classes {
            bits_of[usize::from(id)] = bits;
        }
        let mut operands_of = vec![0u64; slots];
        for c in eg.classes() {
            // An operand outside the table (none in a clean e-graph) matches every rule.
            let operand = |a: &Id| bits_of.get(usize::from(eg.find(*a))).copied();
            operands_of[usize::from(c.id)] = (c.nodes.iter())
                .flat_map(|n| n.args.iter())
                .fold(0, |m, a| m | operand(a).unwrap_or(u64::MAX));
        }
        for (id, _, ops) in &mut classes {
            *ops = operands_of[usize::from(*id)];
        }
        let built_for = fingerprint(eg);
        eg.analysis.index = ClassIndex { classes, built_for };
    }

    /// The ids of the classes of `eg` holding any of `roots`' bits, in id order, and when
    /// `operands` is not 0, reading a class that holds any of its bits: from the index when it
    /// was built for this e-graph, else every class.
    pub fn matching(eg: &EGraph, roots: u64, operands: u64) -> Vec<Id> {
        let index = &eg.analysis.index;
        if index.built_for == fingerprint(eg) {
            return (index.classes.iter())
                .filter(|&&(_, bits, ops)| {
                    bits & roots != 0 && (operands == 0 || ops & operands != 0)
                })
                .map(|&(id, ..)| id)
                .collect();
        }
        let mut ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
        ids.sort_unstable();
        ids
    }
}
