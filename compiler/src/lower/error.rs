//! Why a step cannot be lowered.

use super::target::Target;
use crate::ir::{Graph, NodeId};
use crate::plan::check::PlanViolation;
use crate::precision::Precision;

/// Why a step cannot be lowered: the plan, the node and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LowerError {
    /// The plan breaks a rule of the independent validator.
    #[error("plan: {0}")]
    Plan(#[from] PlanViolation),
    /// The plan gives a node less scratch space than its kernel on this target needs.
    #[error("the plan gives it {planned} bytes of workspace, but the {target} kernel needs {need}: the plan was made for another target or by another version of ingot; plan it for {target} (`ingot compile ... --device {target}`)")]
    Workspace {
        target: Target,
        planned: usize,
        need: usize,
    },
    /// The node cannot be lowered as given: no kernel for it on this backend, operands that
    /// disagree, an address outside the allocation.
    #[error("{op}: {reason}")]
    Invalid { op: &'static str, reason: String },
    /// The target has no arithmetic of this precision (TF32 is a mode of the GPU's tensor
    /// cores).
    #[error("{precision} applies to matrix products on the GPU; the {target} target has no {precision} arithmetic: compile for cuda, or in f32 or bf16")]
    Precision {
        precision: Precision,
        target: Target,
    },
    /// An error lowering one node, named by provenance first (`blocks.3.attn (%412)`).
    #[error("{name} ({op}): {source}")]
    AtNode {
        node: usize,
        /// [`Graph::describe`]: the node's layer, then its id.
        name: String,
        op: &'static str,
        source: Box<LowerError>,
    },
}

impl LowerError {
    /// `e`, as an error lowering node `id` of `g`.
    pub fn at(g: &Graph, id: NodeId, e: LowerError) -> LowerError {
        LowerError::AtNode {
            node: id.index(),
            name: g.describe(id),
            op: g.node(id).op.name(),
            source: Box::new(e),
        }
    }

    /// The error without its node context.
    pub fn root(&self) -> &LowerError {
        match self {
            LowerError::AtNode { source, .. } => source.root(),
            e => e,
        }
    }
}
