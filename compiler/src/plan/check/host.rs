//! The offload check: every offloaded leaf is optimizer state the step updates, named once,
//! its copies at positions of the schedule (in before out), and its home in the host region
//! the right size, aligned, inside the region and apart from every other home (all of them
//! hold their leaf for the whole step). The copies themselves are replayed with the schedule
//! ([`super::replay`]).

use super::view::PlanView;
use super::violation::PlanViolation;
use crate::ir::{LeafKind, Op};

/// The first offload record of `p` that breaks a rule.
pub(super) fn check(p: &PlanView<'_>) -> Result<(), PlanViolation> {
    use PlanViolation as V;
    let g = p.graph;
    let mut seen = vec![false; g.len()];
    for o in p.offload {
        let bad = |reason: String| V::OffloadInvalid {
            leaf: o.leaf,
            reason,
        };
        if o.leaf.index() >= g.len() {
            return Err(bad(format!("the graph has {} nodes", g.len())));
        }
        if !matches!(
            g.node(o.leaf).op,
            Op::Leaf {
                kind: LeafKind::State,
                ..
            }
        ) {
            return Err(bad("it is not optimizer state".into()));
        }
        if !g.updates.iter().any(|u| u.target == o.leaf) {
            return Err(bad("the step does not update it".into()));
        }
        if std::mem::replace(&mut seen[o.leaf.index()], true) {
            return Err(bad("it is offloaded twice".into()));
        }
        if o.copy_in_before > o.copy_out_after || o.copy_out_after >= p.order.len() {
            return Err(bad(format!(
                "copied in before position {} and out after {}, in a schedule of {}",
                o.copy_in_before,
                o.copy_out_after,
                p.order.len()
            )));
        }
        let h = o.host;
        if h.bytes != g.ty(o.leaf).bytes() {
            return Err(bad(format!(
                "its host home holds {} bytes, not its {}",
                h.bytes,
                g.ty(o.leaf).bytes()
            )));
        }
        if !h.offset.is_multiple_of(p.alignment.max(1))
            || h.offset
                .checked_add(h.bytes)
                .is_none_or(|e| e > p.host_bytes)
        {
            return Err(bad(format!(
                "its host home [{}, {}) is misaligned or outside the {} byte host region",
                h.offset,
                h.offset.saturating_add(h.bytes),
                p.host_bytes
            )));
        }
    }
    let mut homes: Vec<_> = p.offload.iter().filter(|o| o.host.bytes > 0).collect();
    homes.sort_by_key(|o| o.host.offset);
    for w in homes.windows(2) {
        if w[0].host.offset + w[0].host.bytes > w[1].host.offset {
            return Err(V::OffloadHomesOverlap {
                a: w[0].leaf,
                b: w[1].leaf,
            });
        }
    }
    Ok(())
}
