//! Why a step could not be planned.

use super::check;
use crate::ir::NodeId;
use crate::schedule::Strategy;
use ingot_dsa as dsa;

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Solver(#[from] dsa::DsaError),
    #[error(transparent)]
    Invalid(#[from] check::PlanViolation),
    /// The outputs of an all-reduce (a gradient bucket) cannot be laid out as one region.
    #[error("all-reduce {node}: {reason}")]
    Bucket { node: NodeId, reason: String },
    #[error("the graph does not verify: {0}")]
    Graph(#[from] crate::error::IrError),
    /// The storages together need more bytes than an address space holds.
    #[error("the step's values together need more bytes than an address space holds (largest: {largest}); lower the batch size, sequence length or model dimensions")]
    TooLarge { largest: String },
    /// The schedule leaves nodes out: their dependences (data and update order) form a cycle.
    #[error("the {strategy:?} schedule cannot order {} of the graph's nodes ({}{}): their data and in-place update dependences form a cycle", .missing.len(), .missing.iter().take(8).map(|n| n.to_string()).collect::<Vec<_>>().join(", "), if .missing.len() > 8 { ", ..." } else { "" })]
    Unschedulable {
        strategy: Strategy,
        missing: Vec<NodeId>,
    },
    /// A leaf asked to be offloaded cannot be.
    #[error("cannot offload {name}: {reason}")]
    Offload { name: String, reason: String },
}
