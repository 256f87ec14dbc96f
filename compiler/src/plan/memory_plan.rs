//! The planner's product: a schedule's liveness with every storage's offset in the one
//! allocation, and how to read a node's location from it.

use super::align::ALIGNMENT;
use super::check::{self, PlanView};
use super::liveness::Liveness;
use super::location::{Location, Offload};
use crate::ir::{Graph, NodeId};
use crate::schedule::Strategy;
use serde::{Deserialize, Serialize};

/// A complete memory plan for one step graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPlan {
    pub strategy: Strategy,
    pub liveness: Liveness,
    /// Absolute offset of each storage in the single allocation.
    pub storage_offset: Vec<usize>,
    pub resident_bytes: usize,
    /// Where the slab starts (the resident region rounded up to the alignment).
    pub slab_base: usize,
    pub slab_bytes: usize,
    /// LOAD: the most slab bytes live at one schedule position, a lower bound on `slab_bytes`.
    pub load_bytes: usize,
    /// The schedule position at which LOAD is reached.
    pub peak_position: usize,
    pub total_bytes: usize,
    /// Leaves kept in host memory ([`super::offload`]), with the copies that move them; none in a
    /// plan without offload (and then absent from its JSON, which stays as it was).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offload: Vec<Offload>,
    /// Bytes of the host region the offloaded leaves live in (pinned memory on a GPU).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_bytes: usize,
}

fn is_zero(x: &usize) -> bool {
    *x == 0
}

impl MemoryPlan {
    /// Location (absolute offset, bytes) of a node's value.
    pub fn location(&self, g: &Graph, id: NodeId) -> Location {
        let s = self.liveness.storage_of[id.index()];
        Location {
            offset: self.storage_offset[s],
            bytes: g.ty(id).bytes(),
        }
    }

    /// Location of a node's kernel workspace, if it has one.
    pub fn workspace(&self, id: NodeId) -> Option<Location> {
        self.liveness.workspace_of[id.index()].map(|s| Location {
            offset: self.storage_offset[s],
            bytes: self.liveness.storages[s].bytes,
        })
    }

    /// For a workspace held from before its node ([`super::liveness::WorkspaceNeed::filled_from`]),
    /// the schedule position of the op after which it is filled: where its storage starts.
    pub fn workspace_filled_after(&self, id: NodeId) -> Option<usize> {
        let s = &self.liveness.storages[self.liveness.workspace_of[id.index()]?];
        (s.start < self.liveness.position[id.index()]).then_some(s.start)
    }

    /// Runs the independent validator over this plan.
    pub fn validate(&self, g: &Graph) -> Result<(), check::PlanViolation> {
        let locations: Vec<Location> = g.ids().map(|id| self.location(g, id)).collect();
        let workspace: Vec<Option<Location>> = g.ids().map(|id| self.workspace(id)).collect();
        let filled_after: Vec<Option<usize>> =
            g.ids().map(|id| self.workspace_filled_after(id)).collect();
        check::validate(&PlanView {
            graph: g,
            order: &self.liveness.order,
            location: &locations,
            workspace: &workspace,
            workspace_filled_after: &filled_after,
            copies: &self.liveness.copies,
            offload: &self.offload,
            host_bytes: self.host_bytes,
            total_bytes: self.total_bytes,
            alignment: ALIGNMENT,
        })
    }
}
