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
//! [`prefetch`] then widens the staging buffer where the step's peak leaves room, so that the
//! copy in is issued well ahead of its reader and the copy out is not waited on at once.
//! The validator replays them with the schedule ([`super::check`]); the CPU lowering, a later
//! stage, turns them into instructions.

use super::liveness::{Liveness, Region};
use super::location::{Location, Offload};
use super::{align_up, PlanError};
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

/// Gives each staging buffer of `offloads` (storages of `lv`, slab) bytes early and late: its
/// copy in moves earlier, and the buffer ends later, wherever the bytes live then leave room
/// under the step's peak (the most slab bytes live at one position, LOAD).
///
/// Why: a staging buffer lives from its first reader, so the solver hands its bytes to other
/// values until just before, and the copy in (which must wait for them) can start only a few
/// operations ahead of the reader: on a GPU the step waits for the copy. Held from earlier,
/// the bytes are the buffer's alone, and the copy runs beside the compute in between (the
/// backward pass, where the activations have died). Likewise a copy out is waited on by
/// whatever takes its bytes next: a buffer that ends later lets it finish behind the compute.
///
/// The rule is in bytes, not operations: a buffer reaches back (then forward) position by
/// position while the bytes live there stay at most the peak, so the step's LOAD, the bound
/// the solver packs against and the fitter's budget measures, does not rise. Copies in are
/// served first, in the order of their readers (the first needed claims the room nearest it);
/// then the copies out, in the order of their writers. In schedule order, so the same step
/// gets the same plan on every machine.
pub(super) fn prefetch(lv: &mut Liveness, offloads: &mut [Offload]) {
    let n = lv.order.len();
    if offloads.is_empty() || n == 0 {
        return;
    }
    let mut live = live_bytes(lv, n);
    let peak = live.iter().copied().max().unwrap_or(0);
    let staging = |lv: &Liveness, o: &Offload| lv.storage_of[o.leaf.index()];
    let mut by_reader: Vec<usize> = (0..offloads.len()).collect();
    by_reader.sort_by_key(|&k| (offloads[k].copy_in_before, k));
    for &k in &by_reader {
        let s = staging(lv, &offloads[k]);
        let bytes = align_up(lv.storages[s].bytes);
        let mut start = lv.storages[s].start;
        while start > 0 && live[start - 1] + bytes <= peak {
            start -= 1;
            live[start] += bytes;
        }
        lv.storages[s].start = start;
        offloads[k].copy_in_before = start;
    }
    let mut by_writer = by_reader;
    by_writer.sort_by_key(|&k| (offloads[k].copy_out_after, k));
    for &k in &by_writer {
        let s = staging(lv, &offloads[k]);
        let bytes = align_up(lv.storages[s].bytes);
        let mut end = lv.storages[s].end;
        while end < n && live[end] + bytes <= peak {
            live[end] += bytes;
            end += 1;
        }
        lv.storages[s].end = end;
    }
}

/// The aligned bytes of slab storages live at each of the `n` schedule positions.
fn live_bytes(lv: &Liveness, n: usize) -> Vec<usize> {
    let mut delta = vec![0isize; n + 1];
    for s in lv.storages.iter().filter(|s| s.region == Region::Slab) {
        let (a, b) = (s.start.min(n), s.end.max(s.start + 1).min(n));
        delta[a] += align_up(s.bytes) as isize;
        delta[b] -= align_up(s.bytes) as isize;
    }
    let mut sum = 0isize;
    delta[..n]
        .iter()
        .map(|d| {
            sum += d;
            sum as usize
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::NodeId;
    use crate::plan::liveness::Storage;

    fn slab(bytes: usize, start: usize, end: usize, owner: u32) -> Storage {
        Storage {
            region: Region::Slab,
            bytes,
            owner: NodeId(owner),
            start,
            end,
            workspace: false,
        }
    }

    /// Ten positions: an activation of 4 KiB live over [0, 4) (the peak, with 1 KiB more at
    /// position 2), 1 KiB over [2, 9), and two staging buffers of 1 KiB each: nodes 3 and 4,
    /// first read at 6 and 7, last written at 7 and 8.
    fn step() -> (Liveness, Vec<Offload>) {
        let storages = vec![
            slab(4096, 0, 4, 0),
            slab(1024, 2, 9, 1),
            slab(1024, 6, 8, 3),
            slab(1024, 7, 9, 4),
        ];
        let lv = Liveness {
            order: (0..10).map(NodeId).collect(),
            position: (0..10).collect(),
            storage_of: vec![0, 1, 1, 2, 3, 0, 0, 0, 0, 0],
            storages,
            copies: Vec::new(),
            workspace_of: vec![None; 10],
        };
        let offload = |leaf: u32, first: usize, last: usize| Offload {
            leaf: NodeId(leaf),
            host: Location {
                offset: 0,
                bytes: 1024,
            },
            copy_in_before: first,
            copy_out_after: last,
        };
        (lv, vec![offload(3, 6, 7), offload(4, 7, 8)])
    }

    #[test]
    fn a_copy_in_moves_as_early_as_the_bytes_live_stay_under_the_peak() {
        let (mut lv, mut offloads) = step();
        let before = live_bytes(&lv, 10);
        let peak = *before.iter().max().unwrap();
        assert_eq!(peak, 5120);
        prefetch(&mut lv, &mut offloads);
        // The first staging buffer reaches back to position 4, where the activation has died
        // (at 3, 4 KiB + 1 KiB are live: the peak, no room); the second, served after it, to
        // position 4 as well: 1 + 1 + 1 KiB still fit under 5 KiB there.
        assert_eq!((offloads[0].copy_in_before, lv.storages[2].start), (4, 4));
        assert_eq!((offloads[1].copy_in_before, lv.storages[3].start), (4, 4));
        // Copies out stay after their writers; the buffers end at the step's end.
        assert_eq!(
            (offloads[0].copy_out_after, offloads[1].copy_out_after),
            (7, 8)
        );
        assert_eq!((lv.storages[2].end, lv.storages[3].end), (10, 10));
        // The peak of bytes live is the one before: LOAD, and so the budget, is not raised.
        assert_eq!(*live_bytes(&lv, 10).iter().max().unwrap(), peak);
    }

    #[test]
    fn a_copy_in_next_to_the_peak_stays_beside_its_reader() {
        let (mut lv, mut offloads) = step();
        // A value of the peak's size live at every position but the staging buffers' own.
        lv.storages[0] = slab(5120, 0, 6, 0);
        lv.storages[1] = slab(0, 0, 0, 1);
        lv.storages.push(slab(5120, 9, 10, 5));
        prefetch(&mut lv, &mut offloads);
        // The first cannot move (position 5 is at the peak); the second moves to the first's
        // position, where only the first's 1 KiB lives; neither outlives position 8.
        assert_eq!(
            (offloads[0].copy_in_before, offloads[1].copy_in_before),
            (6, 6)
        );
        assert_eq!((lv.storages[2].end, lv.storages[3].end), (9, 9));
    }
}
