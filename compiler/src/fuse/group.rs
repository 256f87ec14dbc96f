//! One future kernel ([`Group`]): what fusion's lowering rounds make, merging combines and
//! emitting turns into a fused node.

use super::lower::{Domain, Lowered};
use crate::ir::NodeId;

/// One future kernel: its roots (materialized values it writes), domain and lowering.
pub(super) struct Group {
    pub(super) roots: Vec<NodeId>,
    pub(super) domain: Domain,
    pub(super) lowered: Lowered,
}
