//! Offload: optimizer state kept in host memory between steps and brought to the device only
//! around the ops that read and update it, the fitter's last resort when recomputation and
//! micro-batches cannot bring a step under its budget (ZeRO-Offload's idea, planned ahead).
//!
//! A leaf chosen for offload leaves the resident region. Its storage (the leaf and the new
//! value written over it in place) becomes a slab storage like any other, live from the first
//! op that reads or writes it to the last: the device staging buffer, placed by the same
//! solver as every other value, so that its bytes serve other values for the rest of the step.
//! Its home is a range of a separate host region, packed in the order the leaves were named.
//! Two copies, recorded in the plan as [`Offload`] entries with their schedule positions, move
//! it: host to device before the first of those ops, device to host just after the last.
//! Once the offsets are solved, `prefetch` moves each staging buffer into slab bytes free
//! from earlier, so that the copy in is issued well ahead of its reader, and keeps them after
//! its copy out while nothing else takes them; the plan's total does not change.
//! The validator replays them with the schedule ([`super::check`]); the CPU lowering, a later
//! stage, turns them into instructions.

use super::align::align_up;
use super::error::PlanError;
use super::liveness::{Liveness, Region};
use super::location::{Location, Offload};
use super::memory_plan::MemoryPlan;
use crate::ir::{Graph, LeafKind, Op};

/// Moves the leaves named `names` out of the resident region of `lv`'s storages into the slab
/// (their staging buffers) and gives each a home in the host region. Returns the offloads, in
/// the order of `names`, and the host region's bytes. Each name must be optimizer state that
/// the step reads, updates in place and does not output; anything else is an error naming the
/// leaf and why.
pub(super) fn stage(
    g: &Graph,
    lv: &mut Liveness,
    names: &[String],
) -> Result<(Vec<Offload>, usize), PlanError> {
    if names.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let refuse = |name: &str, reason: &str| PlanError::Offload {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    // For each storage, the index of the offloaded leaf living in it.
    let mut member: Vec<Option<usize>> = vec![None; lv.storages.len()];
    let mut leaves = Vec::with_capacity(names.len());
    for (k, name) in names.iter().enumerate() {
        let id = g
            .leaf(name)
            .ok_or_else(|| refuse(name, "the step has no leaf of that name"))?;
        if !matches!(
            g.node(id).op,
            Op::Leaf {
                kind: LeafKind::State,
                ..
            }
        ) {
            return Err(refuse(name, "only optimizer state is offloaded"));
        }
        if !g.updates.iter().any(|u| u.target == id) {
            return Err(refuse(name, "the step does not update it"));
        }
        if lv.copies.iter().any(|&(_, t)| t == id) {
            return Err(refuse(
                name,
                "its new value is not written over it in place (the plan copies it at the end)",
            ));
        }
        let s = lv.storage_of[id.index()];
        if lv.storages[s].region != Region::Resident || member[s].is_some() {
            return Err(refuse(
                name,
                "it is named twice or shares its bytes with another leaf",
            ));
        }
        if g.outputs.values().any(|o| lv.storage_of[o.index()] == s) {
            return Err(refuse(name, "it is an output of the step"));
        }
        member[s] = Some(k);
        leaves.push((id, s));
    }
    // The first and last position at which each offloaded storage is read or written.
    let mut span: Vec<Option<(usize, usize)>> = vec![None; names.len()];
    let mut touch = |k: usize, p: usize| {
        span[k] = Some(span[k].map_or((p, p), |(a, b)| (a.min(p), b.max(p))));
    };
    for id in g.ids() {
        let p = lv.position[id.index()];
        if let Some(k) = member[lv.storage_of[id.index()]] {
            if id != leaves[k].0 {
                touch(k, lv.position[g.writer(id).index()]);
            }
        }
        for &x in g.reads(id) {
            if let Some(k) = member[lv.storage_of[x.index()]] {
                touch(k, p);
            }
        }
    }
    let mut offloads = Vec::with_capacity(names.len());
    let mut host_bytes = 0usize;
    for (k, &(id, s)) in leaves.iter().enumerate() {
        let (first, last) = span[k].ok_or_else(|| refuse(&names[k], "the step never reads it"))?;
        let st = &mut lv.storages[s];
        st.region = Region::Slab;
        st.start = first;
        st.end = last + 1;
        let bytes = g.ty(id).bytes();
        offloads.push(Offload {
            leaf: id,
            host: Location {
                offset: host_bytes,
                bytes,
            },
            copy_in_before: first,
            copy_out_after: last,
        });
        host_bytes += align_up(bytes);
    }
    Ok((offloads, host_bytes))
}

/// Moves each offloaded leaf's staging buffer of the solved `plan` to the slab bytes that are
/// free the longest before its first use, and issues its copy in there; then lets the buffer
/// hold those bytes for as long after its copy out as nothing else takes them.
///
/// Why: a staging buffer lives from its first reader, so the solver hands its bytes to other
/// values until just before, and the copy in (which must wait for them) can start only a few
/// operations ahead of the reader: on a GPU the step waits for the copy. In bytes free from
/// earlier, the copy runs beside the compute in between (the backward pass, as its
/// activations die). Likewise a copy out is waited on by whatever takes its bytes next.
///
/// After the solve, and only into bytes no other storage holds over the whole widened
/// lifetime: no other offset moves and the slab keeps its size, so the plan's total (what the
/// fitter measures against the budget) and LOAD are those of the plan as solved. Whether some
/// run of free bytes lasts from position `lo` to the buffer's end shrinks as `lo` falls, so the
/// earliest `lo` is found by bisection. Buffers are served in the order of their first use
/// (the first needed takes the bytes first), each at the lowest such run; deterministic.
pub(super) fn prefetch(plan: &mut MemoryPlan) {
    let mut order: Vec<usize> = (0..plan.offload.len()).collect();
    order.sort_by_key(|&k| (plan.offload[k].copy_in_before, k));
    let n = plan.liveness.order.len();
    for k in order {
        let s = plan.liveness.storage_of[plan.offload[k].leaf.index()];
        let (start, end) = (
            plan.liveness.storages[s].start,
            plan.liveness.storages[s].end,
        );
        let bytes = align_up(plan.liveness.storages[s].bytes);
        // The earliest position from which some run of `bytes` stays free until `end`.
        let (mut lo, mut hi) = (0, start);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if free_run(plan, s, bytes, mid, end).is_some() {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        if lo < start {
            if let Some(at) = free_run(plan, s, bytes, lo, end) {
                plan.storage_offset[s] = at;
                plan.liveness.storages[s].start = lo;
                plan.offload[k].copy_in_before = lo;
            }
        }
        // Then as late as its own bytes stay free.
        let at = plan.storage_offset[s];
        let (mut lo, mut hi) = (end, n.max(end));
        while lo < hi {
            let mid = hi - (hi - lo) / 2;
            if held(plan, s, end, mid).all(|(a, b)| b <= at || at + bytes <= a) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        plan.liveness.storages[s].end = lo;
    }
}

/// The byte ranges of slab storages other than `s` live at some position of `[lo, hi)`.
fn held(
    plan: &MemoryPlan,
    s: usize,
    lo: usize,
    hi: usize,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    let lv = &plan.liveness;
    lv.storages.iter().enumerate().filter_map(move |(t, st)| {
        let lives = st.start < hi && lo < st.end.max(st.start + 1);
        (t != s && st.region == Region::Slab && lives && st.bytes > 0).then(|| {
            let a = plan.storage_offset[t];
            (a, a + align_up(st.bytes))
        })
    })
}

/// The lowest offset of a run of `bytes` slab bytes that no storage but `s` holds at any
/// position of `[lo, hi)`, if there is one.
fn free_run(plan: &MemoryPlan, s: usize, bytes: usize, lo: usize, hi: usize) -> Option<usize> {
    let mut taken: Vec<(usize, usize)> = held(plan, s, lo, hi).collect();
    taken.sort_unstable();
    let end = plan.slab_base + plan.slab_bytes;
    let mut cursor = plan.slab_base;
    for (a, b) in taken {
        if a >= cursor + bytes {
            return Some(cursor);
        }
        cursor = cursor.max(b);
    }
    (end >= cursor + bytes).then_some(cursor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::NodeId;
    use crate::plan::liveness::Storage;
    use crate::schedule::Strategy;

    fn slab(bytes: usize, start: usize, end: usize) -> Storage {
        Storage::in_slab(bytes, start, end)
    }

    /// Ten positions over a 3 KiB slab: an activation in [0, 2048) live over [0, 4), a value
    /// in [2048, 3072) over [2, 9), one in [1024, 2048) over [4, 6), and two staging buffers of
    /// 1 KiB (leaves 2 and 3): A at 0 first used at 6, B at 1024 (the dying value's bytes)
    /// first used at 7, each updated and copied out one position later.
    fn solved() -> MemoryPlan {
        let storages = vec![
            slab(2048, 0, 4),
            slab(1024, 2, 9),
            slab(1024, 6, 8),
            slab(1024, 7, 9),
            slab(1024, 4, 6),
        ];
        let offload = |leaf: u32, first: usize| Offload {
            leaf: NodeId(leaf),
            host: Location {
                offset: 0,
                bytes: 1024,
            },
            copy_in_before: first,
            copy_out_after: first + 1,
        };
        MemoryPlan {
            strategy: Strategy::Traced,
            liveness: Liveness {
                order: (0..10).map(NodeId).collect(),
                position: (0..10).collect(),
                storage_of: vec![0, 1, 2, 3, 4, 0, 0, 0, 0, 0],
                storages,
                copies: Vec::new(),
                workspace_of: vec![None; 10],
            },
            storage_offset: vec![0, 2048, 0, 1024, 1024],
            resident_bytes: 0,
            slab_base: 0,
            slab_bytes: 3072,
            load_bytes: 3072,
            peak_position: 2,
            total_bytes: 3072,
            offload: vec![offload(2, 6), offload(3, 7)],
            host_bytes: 2048,
        }
    }

    #[test]
    fn a_copy_in_moves_back_to_where_bytes_free_until_its_reader_begin_and_nothing_else_moves() {
        let mut p = solved();
        prefetch(&mut p);
        let lv = &p.liveness;
        // A: its bytes are free once the activation dies (position 4); B: no run of 1 KiB is
        // free through its use before the value at 1024 dies (6), so it stays on its bytes.
        assert_eq!((p.offload[0].copy_in_before, lv.storages[2].start), (4, 4));
        assert_eq!((p.offload[1].copy_in_before, lv.storages[3].start), (6, 6));
        assert_eq!(p.storage_offset, vec![0, 2048, 0, 1024, 1024]);
        // Copies out stay after their updates; the bytes stay theirs to the step's end.
        assert_eq!(
            (p.offload[0].copy_out_after, p.offload[1].copy_out_after),
            (7, 8)
        );
        assert_eq!((lv.storages[2].end, lv.storages[3].end), (10, 10));
        assert_eq!((p.total_bytes, p.slab_bytes), (3072, 3072));
        // No two storages live at once share a byte.
        for (i, a) in lv.storages.iter().enumerate() {
            for (j, b) in lv.storages.iter().enumerate().skip(i + 1) {
                let together = a.start < b.end && b.start < a.end;
                let (x, y) = (p.storage_offset[i], p.storage_offset[j]);
                let share = x < y + b.bytes && y < x + a.bytes;
                assert!(!(together && share), "storages {i} and {j}");
            }
        }
    }

    #[test]
    fn a_staging_buffer_moves_to_other_bytes_when_those_are_free_from_earlier() {
        // B's own bytes belong to the dying value until 6, but [0, 1024) is free from 4 when
        // A is not there: B moves to offset 0 and its copy in to 4.
        let mut p = solved();
        p.offload.remove(0);
        p.liveness.storages[2] = slab(0, 0, 0);
        prefetch(&mut p);
        assert_eq!(p.offload[0].copy_in_before, 4);
        assert_eq!(p.storage_offset[3], 0);
        assert_eq!(p.liveness.storages[3].start, 4);
    }
}
