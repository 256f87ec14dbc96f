//! Where a value lives in the step's one allocation: what the planner assigns, the validator
//! checks, the lowering turns into byte offsets and the runtimes read. A plain byte range, kept
//! apart from both the planner and its checker so that each can use it without the other.

/// Where one node's value lives, as an absolute byte range of the step's single allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    pub offset: usize,
    pub bytes: usize,
}

/// A leaf (optimizer state) kept in host memory between the uses the step makes of it: its
/// home in the host region, and the two copies that move it. Before the op at schedule
/// position `copy_in_before` runs, its `host` bytes are copied to its device location (a
/// staging buffer in the slab, planned like any value, live from there on); after the op at
/// `copy_out_after` runs, the staging buffer, which then holds the leaf's new value, is copied
/// back to `host`, and the staging buffer dies. What the planner decides, the validator checks
/// and the executors run; a plain record, shared by both sides like [`Location`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offload {
    /// The leaf kept on the host.
    pub leaf: crate::ir::NodeId,
    /// Its home: a byte range of the host region (offsets from the region's start).
    pub host: Location,
    /// The schedule position before whose op it is copied in.
    pub copy_in_before: usize,
    /// The schedule position after whose op its new value is copied out.
    pub copy_out_after: usize,
}
