//! Offload's copies ([`crate::plan::offload`]) as every target's program holds them, and the
//! one check of them: a CPU program's `CopyIn`/`CopyOut` instructions and a CUDA program's
//! copy operations carry the same two records and are checked alike.

use crate::ir::NodeId;
use crate::plan::{MemoryPlan, Offload};
use serde::{Deserialize, Serialize};

/// Offload's copy in: the `bytes` bytes at `host` in the host region (offloaded leaf `leaf`'s
/// home) into its staging buffer at `to` in the allocation. A CPU program runs it where it
/// stands; a CUDA program's runtime captures it on its copy stream (the dependency graph
/// orders it after the last use of the staging bytes before it and before the leaf's first
/// reader, so it overlaps the compute around it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyIn {
    pub leaf: NodeId,
    pub host: usize,
    pub to: usize,
    pub bytes: usize,
}

/// Offload's copy out: leaf `leaf`'s staging buffer at `from`, holding its new value once its
/// last writer has run, back to its home at `host` in the host region (on a GPU, on the copy
/// stream: anything later that takes those slab bytes waits for it, write after read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyOut {
    pub leaf: NodeId,
    pub from: usize,
    pub host: usize,
    pub bytes: usize,
}

impl CopyIn {
    /// The copy in of planned offload `o` to its staging buffer at `staging`.
    pub(crate) fn of(o: &Offload, staging: usize) -> Self {
        CopyIn {
            leaf: o.leaf,
            host: o.host.offset,
            to: staging,
            bytes: o.host.bytes,
        }
    }
}

impl CopyOut {
    /// The copy out of planned offload `o` from its staging buffer at `staging`.
    pub(crate) fn of(o: &Offload, staging: usize) -> Self {
        CopyOut {
            leaf: o.leaf,
            from: staging,
            host: o.host.offset,
            bytes: o.host.bytes,
        }
    }
}

/// An offload copy as a program records it: between `leaf`'s home at `host` in the host region
/// and its staging bytes at `device` in the allocation, in either direction (`inward`: to the
/// device).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OffloadCopy {
    pub leaf: NodeId,
    pub host: usize,
    pub device: usize,
    pub bytes: usize,
    pub inward: bool,
}

impl From<CopyIn> for OffloadCopy {
    fn from(c: CopyIn) -> Self {
        OffloadCopy {
            leaf: c.leaf,
            host: c.host,
            device: c.to,
            bytes: c.bytes,
            inward: true,
        }
    }
}

impl From<CopyOut> for OffloadCopy {
    fn from(c: CopyOut) -> Self {
        OffloadCopy {
            leaf: c.leaf,
            host: c.host,
            device: c.from,
            bytes: c.bytes,
            inward: false,
        }
    }
}

/// The copies are exactly the plan's: one in and one out per offloaded leaf, each between its
/// home (offset and size as planned, inside the host region) and a range inside the
/// allocation, at `staging(leaf)` where the caller knows the leaf's planned offset. The error
/// says which copy is not the plan's, or how the counts differ.
pub(crate) fn check_copies(
    plan: &MemoryPlan,
    copies: impl IntoIterator<Item = OffloadCopy>,
    staging: impl Fn(NodeId) -> Option<usize>,
) -> Result<(), String> {
    let (mut copies_in, mut copies_out) = (0, 0);
    for c in copies {
        if c.inward {
            copies_in += 1;
        } else {
            copies_out += 1;
        }
        let planned = plan
            .offload
            .iter()
            .any(|o| o.leaf == c.leaf && o.host.offset == c.host && o.host.bytes == c.bytes);
        let inside = |at: usize, len: usize| at.checked_add(c.bytes).is_some_and(|e| e <= len);
        let staged = staging(c.leaf).is_none_or(|at| at == c.device);
        if !planned
            || !staged
            || !inside(c.host, plan.host_bytes)
            || !inside(c.device, plan.total_bytes)
        {
            return Err(format!(
                "an offload copy of {} ({} bytes, host {}, device {}) is not one the plan makes",
                c.leaf, c.bytes, c.host, c.device
            ));
        }
    }
    if (copies_in, copies_out) != (plan.offload.len(), plan.offload.len()) {
        return Err(format!(
            "the plan offloads {} leaves but the program copies {copies_in} in and {copies_out} \
             out",
            plan.offload.len()
        ));
    }
    Ok(())
}
