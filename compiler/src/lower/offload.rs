//! The one check of a program's offload copies, for every target: a CPU program's
//! `CopyIn`/`CopyOut` instructions and a CUDA program's copy operations are checked alike.

use crate::ir::NodeId;
use crate::plan::MemoryPlan;

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
