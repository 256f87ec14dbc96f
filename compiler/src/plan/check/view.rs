//! The plan as the checker sees it: borrowed tables, so that the checker reads what the planner
//! produced without sharing a type of the planner's own.

use crate::ir::{Graph, NodeId};
use crate::plan::location::{Location, Offload};

/// What the checker needs to know about a plan.
pub struct PlanView<'a> {
    pub graph: &'a Graph,
    pub order: &'a [NodeId],
    /// Location of each node's value, indexed by node.
    pub location: &'a [Location],
    /// Scratch space each node's kernel may overwrite while it runs, indexed by node.
    pub workspace: &'a [Option<Location>],
    /// For a node whose workspace is filled ahead of it (a scatter-add's ids sorted there, see
    /// `liveness::WorkspaceNeed`), the schedule position of the op after which the fill runs:
    /// from there to the node, nothing else may write the workspace's bytes, and what lived
    /// there is gone. Indexed by node; `None` for a workspace used only while its node runs.
    pub workspace_filled_after: &'a [Option<usize>],
    /// `(value, target)` copies done after the last op.
    pub copies: &'a [(NodeId, NodeId)],
    /// Leaves kept in the host region and the copies that move them (`location` gives their
    /// device staging buffers), and that region's bytes.
    pub offload: &'a [Offload],
    pub host_bytes: usize,
    /// Size of the single allocation.
    pub total_bytes: usize,
    pub alignment: usize,
}
