//! A group while merging ([`Part`]): its roots, domain and loads, and what its kernel holds
//! (reductions, scratch, body), so that a merge can be weighed, and often decided, before the
//! merged group is lowered.

use crate::fuse::group::Group;
use crate::fuse::lower::{Domain, Lowered};
use crate::fuse::select;
use crate::ir::{Graph, NodeId};
use ingot_kernels::fused::Access;
use std::collections::BTreeMap;

/// A group while merging: its lowering may be left for the end (see [`merge`](super::merge)).
pub(super) struct Part {
    /// Sorted whenever `lowered` is present.
    pub(super) roots: Vec<NodeId>,
    pub(super) domain: Domain,
    /// `None` after a merge decided without lowering: lowered once, at the end.
    pub(super) lowered: Option<Lowered>,
    /// What the kernel loads, with the access of each load (repeats allowed), by the value
    /// each reads through its views. After a merge decided without lowering it may also hold
    /// reads of the group's own roots (see [`merge`](super::merge)): they name the group itself, so no edge
    /// and no merge comes of them.
    pub(super) loads: Loads,
    /// No reduction anywhere: no reduce axes, none staged.
    pub(super) elementwise: bool,
    /// The reductions of its kernel (0 for an elementwise group).
    pub(super) reductions: usize,
    /// Scratch bytes its kernel needs on the CPU executor
    /// ([`ingot_kernels::fused::cpu::scratch_bytes`]): exact for a lowered group, estimated by
    /// [`merged_scratch`] for one merged without lowering.
    pub(super) scratch: usize,
    /// Instructions of its kernel's body (for a group merged without lowering, its parts'
    /// together: at most that).
    pub(super) body: usize,
}

/// Bytes of the CPU executor's per-instruction tables for each instruction of a kernel with
/// `reductions` reductions (`kernels/src/fused/cpu/analysis.rs`: twelve words an instruction
/// and one more per reduction level, a level being each reduction and the final pass).
fn table_bytes_per_instruction(reductions: usize) -> usize {
    8 * (13 + reductions)
}

/// The scratch of `x` and `y` merged into one kernel: the larger one's, plus the other's
/// instructions in the tables (each at the merged kernel's reduction levels). Lane buffers do
/// not add up: the executor gives a longer body fewer lanes.
pub(super) fn merged_scratch(x: &Part, y: &Part) -> usize {
    let per = table_bytes_per_instruction(x.reductions + y.reductions);
    x.scratch.max(y.scratch) + per * x.body.min(y.body)
}

/// A group's loads keyed by the value each reads through its views ([`select::base`]): what
/// merging asks of them, "does this group read what that one produces, and how", is answered
/// by looking up the other group's roots, not by scanning every load. A group that absorbs
/// thousands of small producers (a long backward chain) would otherwise be rescanned at each.
#[derive(Default)]
pub(super) struct Loads(pub(super) BTreeMap<NodeId, Vec<(NodeId, Access)>>);

impl Loads {
    pub(super) fn of(g: &Graph, loads: impl IntoIterator<Item = (NodeId, Access)>) -> Loads {
        let mut by_base: BTreeMap<NodeId, Vec<(NodeId, Access)>> = BTreeMap::new();
        for (x, access) in loads {
            by_base
                .entry(select::base(g, x))
                .or_default()
                .push((x, access));
        }
        Loads(by_base)
    }

    /// Every load.
    pub(super) fn iter(&self) -> impl Iterator<Item = &(NodeId, Access)> {
        self.0.values().flatten()
    }

    /// The loads of `base` (through any view).
    pub(super) fn of_base(&self, base: NodeId) -> &[(NodeId, Access)] {
        self.0.get(&base).map_or(&[], Vec::as_slice)
    }

    /// The values read, each once.
    pub(super) fn bases(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.0.keys().copied()
    }

    /// Takes in `other`'s loads (the smaller map is moved into the larger).
    pub(super) fn absorb(&mut self, mut other: Loads) {
        if other.0.len() > self.0.len() {
            std::mem::swap(self, &mut other);
        }
        for (base, mut v) in other.0 {
            self.0.entry(base).or_default().append(&mut v);
        }
    }
}

impl Part {
    pub(super) fn of(g: &Graph, gr: Group) -> Part {
        let loads = Loads::of(
            g,
            gr.lowered
                .inputs
                .iter()
                .zip(&gr.lowered.kernel.inputs)
                .map(|(&x, i)| (x, i.access.clone())),
        );
        Part {
            elementwise: gr.domain.axes.is_none() && gr.lowered.kernel.reduce_axes.is_empty(),
            reductions: gr.lowered.kernel.reductions(),
            scratch: ingot_kernels::fused::cpu::scratch_bytes(&gr.lowered.kernel),
            body: gr.lowered.kernel.body.len(),
            roots: gr.roots,
            domain: gr.domain,
            lowered: Some(gr.lowered),
            loads,
        }
    }
}
