//! Workspaces grown into the bytes a solved slab leaves free around them.
//!
//! A kernel that runs faster in more scratch (the CPU convolutions, one lane of column buffer
//! per thread) is planned with the least it runs in, like any workspace, so the offsets and
//! the total are those of the least. Once the offsets are solved, each such workspace takes
//! the largest run of slab bytes that no other storage holds while it lives, up to what it
//! asks for ([`super::PlanOptions::workspace_room`]). It may move to another offset, but
//! nothing else moves and the slab keeps its size: the plan's total is never raised, which
//! `grow_workspaces`'s slack over the peak (the CUDA rule: a 64th of the peak, at least 1 MiB)
//! would do to a small CPU plan whose peak is a convolution's workspace.
//!
//! A workspace live at the plan's peak position keeps its least bytes, so the report's
//! account of the peak (what is live there, by kind) is the one the plan had before.

use super::align::align_up;
use super::liveness::Region;
use super::memory_plan::MemoryPlan;
use crate::ir::{Graph, NodeId};

/// The bytes a node's workspace runs fastest in (0: no more than it needs).
pub type WorkspaceRoomFn = fn(&Graph, NodeId) -> usize;

/// Grows, in schedule order, each workspace that `room` asks more bytes for into the largest
/// free run of the slab over its lifetime (ties: where it lies, then the lowest offset).
pub(crate) fn grow_into_free_bytes(g: &Graph, plan: &mut MemoryPlan, room: WorkspaceRoomFn) {
    let lv = &plan.liveness;
    let peak = plan.peak_position;
    let wanted: Vec<(usize, usize)> = lv
        .order
        .iter()
        .filter_map(|&id| {
            let s = lv.workspace_of[id.index()]?;
            let st = &lv.storages[s];
            let lives_at_peak = st.start <= peak && peak < st.end.max(st.start + 1);
            let up_to = room(g, id);
            (up_to > st.bytes && !lives_at_peak).then_some((s, up_to))
        })
        .collect();
    let (base, end) = (plan.slab_base, plan.slab_base + plan.slab_bytes);
    for (s, up_to) in wanted {
        let (at, free) = largest_free_run(plan, s, base, end);
        let bytes = up_to.min(free);
        if bytes > plan.liveness.storages[s].bytes {
            plan.liveness.storages[s].bytes = bytes;
            plan.storage_offset[s] = at;
        }
    }
}

/// The offset and length of the largest run of `[base, end)` that no slab storage other than
/// `s` holds while `s` lives: `s`'s own run when it is among the largest, else the lowest.
fn largest_free_run(plan: &MemoryPlan, s: usize, base: usize, end: usize) -> (usize, usize) {
    let lv = &plan.liveness;
    let me = &lv.storages[s];
    let (lo, hi) = (me.start, me.end.max(me.start + 1));
    let mut held: Vec<(usize, usize)> = lv
        .storages
        .iter()
        .enumerate()
        .filter(|&(t, st)| {
            t != s && st.region == Region::Slab && st.start < hi && lo < st.end.max(st.start + 1)
        })
        .map(|(t, st)| {
            (
                plan.storage_offset[t],
                plan.storage_offset[t] + align_up(st.bytes),
            )
        })
        .collect();
    held.sort_unstable();
    let mine = plan.storage_offset[s];
    let mut best = (mine, 0usize);
    let mut consider = |from: usize, to: usize| {
        let len = to.saturating_sub(from);
        let holds_mine = from <= mine && mine < to;
        if len > best.1 || (len == best.1 && holds_mine) {
            best = (from, len);
        }
    };
    let mut cursor = base;
    for (a, b) in held {
        if a > cursor {
            consider(cursor, a.min(end));
        }
        cursor = cursor.max(b);
    }
    if end > cursor {
        consider(cursor, end);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, Init};
    use crate::plan::{plan, PlanOptions, WorkspaceNeed};

    /// Two matmuls in a chain, each given a 256-byte workspace and asking for up to 1 MiB.
    fn chain() -> Graph {
        let mut g = Graph::new();
        let w = g.parameter("w", [64, 64], DType::F32, Init::Ones).unwrap();
        let x = g.input("x", [64, 64], DType::F32).unwrap();
        let a = g.matmul(x, w).unwrap();
        let b = g.matmul(a, w).unwrap();
        let c = g.matmul(b, w).unwrap();
        g.set_output("loss", c).unwrap();
        g
    }

    fn need(g: &Graph, id: NodeId) -> WorkspaceNeed {
        WorkspaceNeed::at_node(match g.node(id).op {
            crate::ir::Op::MatMul { .. } => 256,
            _ => 0,
        })
    }

    fn room(g: &Graph, id: NodeId) -> usize {
        match g.node(id).op {
            crate::ir::Op::MatMul { .. } => 1 << 20,
            _ => 0,
        }
    }

    /// The total stays the least plan's, every grown workspace lies inside the slab beside no
    /// live value (the independent validator agrees), and one grows where the slab has room.
    #[test]
    fn a_workspace_grows_into_free_slab_bytes_and_the_total_never_rises() {
        let g = chain();
        let least = plan(
            &g,
            &PlanOptions {
                workspace: Some(need),
                ..PlanOptions::default()
            },
        )
        .unwrap();
        let grown = plan(
            &g,
            &PlanOptions {
                workspace: Some(need),
                workspace_room: Some(room),
                ..PlanOptions::default()
            },
        )
        .unwrap();
        assert_eq!(grown.total_bytes, least.total_bytes);
        assert_eq!(grown.slab_bytes, least.slab_bytes);
        grown.validate(&g).unwrap();
        let sizes = |p: &MemoryPlan| -> Vec<usize> {
            g.ids()
                .filter_map(|id| p.workspace(id))
                .map(|w| w.bytes)
                .collect()
        };
        let (before, after) = (sizes(&least), sizes(&grown));
        assert_eq!(before, vec![256; 3]);
        assert!(
            after.iter().zip(&before).any(|(a, b)| a > b),
            "{before:?} -> {after:?}"
        );
        for id in g.ids() {
            if let Some(w) = grown.workspace(id) {
                assert!(w.offset + w.bytes <= grown.total_bytes);
            }
        }
    }
}
