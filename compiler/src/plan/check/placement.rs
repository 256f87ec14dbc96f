//! The placement check: every value's location is the size of its type, aligned and inside the
//! allocation, and every workspace is aligned and inside it.

use super::view::PlanView;
use super::violation::PlanViolation;
use crate::ir::NodeId;

/// How a byte range `[offset, offset + bytes)` breaks the placement rules, if it does.
enum Misplaced {
    Misaligned,
    Outside { end: usize },
}

/// How `[offset, offset + bytes)` breaks `p`'s alignment or allocation, if it does.
fn misplaced(offset: usize, bytes: usize, p: &PlanView<'_>) -> Option<Misplaced> {
    if !offset.is_multiple_of(p.alignment.max(1)) {
        return Some(Misplaced::Misaligned);
    }
    offset
        .checked_add(bytes)
        .is_none_or(|e| e > p.total_bytes)
        .then(|| Misplaced::Outside {
            end: offset.saturating_add(bytes),
        })
}

impl Misplaced {
    /// The violation this is for the value of `node` (with `workspace`, its workspace) placed
    /// at `offset` in `p`.
    fn violation(
        self,
        node: NodeId,
        offset: usize,
        p: &PlanView<'_>,
        workspace: bool,
    ) -> PlanViolation {
        use PlanViolation as V;
        let (alignment, total) = (p.alignment, p.total_bytes);
        match (self, workspace) {
            (Misplaced::Misaligned, false) => V::Misaligned {
                node,
                offset,
                alignment,
            },
            (Misplaced::Misaligned, true) => V::WorkspaceMisaligned {
                node,
                offset,
                alignment,
            },
            (Misplaced::Outside { end }, false) => V::OutsideAllocation {
                node,
                start: offset,
                end,
                total,
            },
            (Misplaced::Outside { end }, true) => V::WorkspaceOutsideAllocation {
                node,
                start: offset,
                end,
                total,
            },
        }
    }
}

/// The first value or workspace of `p` placed wrongly.
pub(super) fn check(p: &PlanView<'_>) -> Result<(), PlanViolation> {
    use PlanViolation as V;
    let g = p.graph;
    // Every location is aligned, the right size, and inside the allocation.
    for id in g.ids() {
        let l = p.location[id.index()];
        if l.bytes != g.ty(id).bytes() {
            return Err(V::WrongSize {
                node: id,
                needs: g.ty(id).bytes(),
                given: l.bytes,
            });
        }
        if let Some(m) = misplaced(l.offset, l.bytes, p) {
            return Err(m.violation(id, l.offset, p, false));
        }
    }
    for (id, w) in g.ids().zip(p.workspace) {
        let Some(w) = *w else { continue };
        if let Some(m) = misplaced(w.offset, w.bytes, p) {
            return Err(m.violation(id, w.offset, p, true));
        }
    }
    Ok(())
}
