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
//! it: host to device just before the first of those ops, device to host just after the last.
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
