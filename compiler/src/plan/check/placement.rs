//! The placement check: every value's location is the size of its type, aligned and inside the
//! allocation, and every workspace is aligned and inside it.

use super::{PlanView, PlanViolation};

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
        match misplaced(l.offset, l.bytes, p) {
            Some(Misplaced::Misaligned) => {
                return Err(V::Misaligned {
                    node: id,
                    offset: l.offset,
                    alignment: p.alignment,
                })
            }
            Some(Misplaced::Outside { end }) => {
                return Err(V::OutsideAllocation {
                    node: id,
                    start: l.offset,
                    end,
                    total: p.total_bytes,
                })
            }
            None => {}
        }
    }
    for (id, w) in g.ids().zip(p.workspace) {
        let Some(w) = *w else { continue };
        match misplaced(w.offset, w.bytes, p) {
            Some(Misplaced::Misaligned) => {
                return Err(V::WorkspaceMisaligned {
                    node: id,
                    offset: w.offset,
                    alignment: p.alignment,
                })
            }
            Some(Misplaced::Outside { end }) => {
                return Err(V::WorkspaceOutsideAllocation {
                    node: id,
                    start: w.offset,
                    end,
                    total: p.total_bytes,
                })
            }
            None => {}
        }
    }
    Ok(())
}
