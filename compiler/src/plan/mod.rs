//! Memory planning: a schedule, liveness over it, offsets in one slab, and a validator that
//! shares no code with the planner.
//!
//! The single device allocation is laid out as `[resident region | slab]`. The resident region
//! holds parameters, optimizer state and inputs, each at a fixed offset, in graph order. The
//! slab holds everything else at offsets chosen by the [`ingot_dsa`] solver (its own crate) from liveness
//! intervals.

pub mod align;
pub mod buckets;
pub mod check;
pub mod error;
pub mod liveness;
pub mod location;
pub mod memory_plan;
pub mod offload;
mod recall;
pub mod room;
pub mod shared;
pub mod sink;

use crate::ir::{Graph, NodeId};
use crate::schedule::{self, Strategy};
pub use align::{align_up, ALIGNMENT};
pub use error::PlanError;
use ingot_dsa as dsa;
pub use liveness::{Liveness, Region, Storage, WorkspaceFn, WorkspaceNeed};
pub use location::{Location, Offload};
pub use memory_plan::MemoryPlan;
use std::time::Duration;

/// Knobs of the planner.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Search nodes the offset solver may spend improving on its greedy placement, per
    /// schedule. This, not time, is what bounds the search, so the same graph gets the same plan
    /// on every machine (invariant 5).
    pub solver_nodes: u64,
    /// A safety net on the solver's CPU time per schedule (the solving threads' own clocks, so
    /// a loaded machine does not stop it sooner: with wall-clock time, two compiles of one
    /// model at load 12 planned two slabs); a search stopped by it (not by `solver_nodes`)
    /// could differ on a much slower processor, so it is set far above what the node budget
    /// needs.
    pub solver_time: Duration,
    /// Which schedules to try; the smallest plan wins.
    pub strategies: Vec<Strategy>,
    /// Scratch bytes each node's kernel needs on the target (the CPU runtime's matmul packs its
    /// panels there); `None` plans no workspace.
    pub workspace: Option<WorkspaceFn>,
    /// Bytes each node's workspace runs fastest in, granted once the offsets are solved from
    /// the slab bytes free around it ([`room`]: the CPU convolutions' lanes); never raises
    /// the total. `None` grows nothing.
    pub workspace_room: Option<room::WorkspaceRoomFn>,
    /// Sink each schedule ([`sink::sink`]): every node moved down to just before the
    /// first node that needs it where that cannot raise the bytes live. On for steps that
    /// recompute forward values for the backward pass (whose copies free memory only if they
    /// run late), off otherwise, so those plans stay as they were.
    pub sink: bool,
    /// Optimizer state to keep in host memory between its uses ([`offload`]), by leaf name:
    /// the fitter's last resort. Empty (the default): nothing offloaded, the plan as always.
    pub offload: Vec<String>,
    /// Move the offloaded leaves' staging buffers, once the offsets are solved, into slab
    /// bytes free from earlier (`offload::prefetch`): each copy in is issued ahead of its
    /// reader, and a copy out is not waited on at once; the total does not change. On (the
    /// default); off, a staging buffer lives from its first use to its last, as before (a
    /// plan to compare with).
    pub prefetch: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            solver_nodes: 100_000,
            solver_time: Duration::from_secs(10),
            strategies: vec![Strategy::Traced, Strategy::MemoryAware],
            workspace: None,
            workspace_room: None,
            sink: false,
            offload: Vec::new(),
            prefetch: true,
        }
    }
}

/// Plans `g` under each strategy of `opts` and keeps the smallest total (ties: the first).
///
/// LOAD bounds a schedule's slab from below and costs one sweep, while solving for offsets can
/// take the solver's whole budget; so schedules are solved in order of LOAD, and one whose LOAD
/// cannot beat the best slab found is skipped. Debug builds validate every plan; release builds
/// validate the one returned.
pub fn plan(g: &Graph, opts: &PlanOptions) -> Result<MemoryPlan, PlanError> {
    g.verify()?;
    let mut candidates: Vec<Prepared> = Vec::new();
    for &strategy in &opts.strategies {
        for order in orders(g, strategy) {
            candidates.push(prepare(g, strategy, order, opts)?);
        }
    }
    candidates.sort_by_key(|c| c.load_bytes);
    let mut best: Option<MemoryPlan> = None;
    for c in candidates {
        if best.as_ref().is_some_and(|b| c.load_bytes >= b.slab_bytes) {
            continue;
        }
        let p = c.solve(opts)?;
        if cfg!(debug_assertions) {
            p.validate(g)?;
        }
        if best.as_ref().is_none_or(|b| p.total_bytes < b.total_bytes) {
            best = Some(p);
        }
    }
    let mut best = best
        .ok_or_else(|| crate::error::IrError::Invalid("no scheduling strategy was given".into()))?;
    if opts.prefetch && !best.offload.is_empty() {
        offload::prefetch(&mut best);
        if cfg!(debug_assertions) {
            best.validate(g)?;
        }
    }
    if let Some(room) = opts.workspace_room {
        room::grow_into_free_bytes(g, &mut best, room);
        if cfg!(debug_assertions) {
            best.validate(g)?;
        }
    }
    // Release builds validate a plan once, where the lower stage turns it into addresses;
    // debug builds validated every candidate above too (DESIGN.md, invariant 1).
    Ok(best)
}

/// The schedules `strategy` offers: the memory-aware one; the traced one and, where some
/// convolution's filter gradient moves before its data gradient to free its input first
/// ([`schedule::filter_gradients_first`]), that order first. Both traced orders are planned
/// like any two candidates (the smaller total kept; of equal LOADs the moved one is solved
/// first and wins a tie), so the move never raises a plan: it holds no more bytes live
/// anywhere, but the offsets solved for it may pack less tightly (efficientnet_b0's, by
/// 370 KB: docs/benchmarks.md, session 42).
fn orders(g: &Graph, strategy: Strategy) -> Vec<Vec<NodeId>> {
    match strategy {
        Strategy::Traced => {
            let moved = schedule::filter_gradients_first(g);
            moved.into_iter().chain([schedule::traced(g)]).collect()
        }
        Strategy::MemoryAware => vec![schedule::memory_aware(g)],
    }
}

/// `order` (a schedule of `strategy`) with its liveness. With [`PlanOptions::sink`], the
/// schedule sunk ([`sink::sink`]) unless that raises its LOAD: sinking never lets a value
/// live longer at a position that stays, but a chain of nodes moved together can meet, where
/// it lands, values (and a kernel's scratch) it did not meet before.
fn prepare(
    g: &Graph,
    strategy: Strategy,
    order: Vec<NodeId>,
    opts: &PlanOptions,
) -> Result<Prepared, PlanError> {
    let sunk = opts.sink.then(|| sink::sink(g, &order, opts.workspace));
    let order = schedule::hoist_collectives(g, order);
    complete(g, &order, strategy)?;
    let plain = Prepared::new(g, &order, strategy, opts)?;
    let Some(sunk) = sunk else {
        return Ok(plain);
    };
    let sunk = schedule::hoist_collectives(g, sunk);
    complete(g, &sunk, strategy)?;
    let sunk = Prepared::new(g, &sunk, strategy, opts)?;
    Ok(if sunk.load_bytes <= plain.load_bytes {
        sunk
    } else {
        plain
    })
}

/// Every node of `g` is in `order` (a list schedule leaves out the nodes of a dependence
/// cycle; liveness would give them no storage).
fn complete(g: &Graph, order: &[NodeId], strategy: Strategy) -> Result<(), PlanError> {
    let mut seen = vec![false; g.len()];
    for &id in order {
        if let Some(s) = seen.get_mut(id.index()) {
            *s = true;
        }
    }
    let missing: Vec<NodeId> = g.ids().filter(|id| !seen[id.index()]).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PlanError::Unschedulable { strategy, missing })
    }
}

/// Plans `g` for one given schedule.
pub fn plan_order(
    g: &Graph,
    order: &[NodeId],
    strategy: Strategy,
    solver_time: Duration,
) -> Result<MemoryPlan, PlanError> {
    complete(g, order, strategy)?;
    let opts = PlanOptions {
        solver_time,
        ..PlanOptions::default()
    };
    Prepared::new(g, order, strategy, &opts)?.solve(&opts)
}

/// A schedule with its liveness, resident layout and slab problem, before offsets are solved.
struct Prepared {
    strategy: Strategy,
    liveness: Liveness,
    storage_offset: Vec<usize>,
    resident_bytes: usize,
    /// The slab's placement items, one solver buffer each: a storage alone, or the storages of
    /// an all-reduce's outputs laid out adjacently (each member with its offset in the item).
    slab: Vec<Vec<(usize, usize)>>,
    problem: dsa::Problem,
    load_bytes: usize,
    peak_position: usize,
    offload: Vec<Offload>,
    host_bytes: usize,
}

impl Prepared {
    fn new(
        g: &Graph,
        order: &[NodeId],
        strategy: Strategy,
        opts: &PlanOptions,
    ) -> Result<Prepared, PlanError> {
        let mut liveness = Liveness::analyse(g, order, opts.workspace);
        let (offload, host_bytes) = offload::stage(g, &mut liveness, &opts.offload)?;
        // Every offset the plan can give is at most the sum of all aligned storage sizes: when
        // that sum fits, no offset, end or total computed below (or by the solver) overflows.
        let sum = liveness.storages.iter().try_fold(0usize, |acc, s| {
            acc.checked_add(s.bytes.checked_next_multiple_of(ALIGNMENT)?)
                .filter(|&t| t <= isize::MAX as usize)
        });
        if sum.is_none() {
            let mut largest: Vec<&Storage> = liveness.storages.iter().collect();
            largest.sort_by_key(|s| std::cmp::Reverse(s.bytes));
            return Err(PlanError::TooLarge {
                largest: largest
                    .iter()
                    .take(3)
                    .map(|s| {
                        format!(
                            "{} {} ({} bytes)",
                            g.describe(s.owner),
                            g.ty(s.owner),
                            s.bytes
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let mut storage_offset = vec![0usize; liveness.storages.len()];
        // Resident storages, packed in graph order.
        let mut resident_bytes = 0usize;
        for (i, s) in liveness.storages.iter().enumerate() {
            if s.region == Region::Resident {
                storage_offset[i] = resident_bytes;
                resident_bytes += align_up(s.bytes);
            }
        }
        let slab = slab_items(g, &liveness)?;
        let problem = dsa::Problem {
            buffers: slab
                .iter()
                .map(|item| {
                    let members = || item.iter().map(|&(i, _)| &liveness.storages[i]);
                    let start = members().map(|s| s.start).min().unwrap_or(0);
                    let end = members().map(|s| s.end).max().unwrap_or(0);
                    // Sizes are rounded up to the alignment: every storage starts on an aligned
                    // offset, so the bytes up to the next one are unusable by others anyway, and
                    // LOAD computed on these sizes is the bound the solver is measured against.
                    dsa::Buffer {
                        id: item[0].0 as u64,
                        lower: start as u64,
                        upper: end.max(start + 1) as u64,
                        size: members().map(|s| align_up(s.bytes)).sum::<usize>() as u64,
                    }
                })
                .collect(),
            alignment: ALIGNMENT as u64,
        };
        let (load_bytes, peak_position) = load_and_peak(&problem);
        Ok(Prepared {
            strategy,
            liveness,
            storage_offset,
            resident_bytes,
            slab,
            problem,
            load_bytes,
            peak_position,
            offload,
            host_bytes,
        })
    }

    fn solve(mut self, opts: &PlanOptions) -> Result<MemoryPlan, PlanError> {
        let slab_base = align_up(self.resident_bytes);
        let (solution, _recalled) = recall::solve(
            &self.problem,
            &dsa::SolveOptions {
                time_limit: opts.solver_time,
                node_limit: opts.solver_nodes,
                ..Default::default()
            },
        )?;
        for (k, item) in self.slab.iter().enumerate() {
            for &(i, at) in item {
                self.storage_offset[i] = slab_base + solution.offsets[k] as usize + at;
            }
        }
        let slab_bytes = align_up(solution.peak as usize);
        Ok(MemoryPlan {
            strategy: self.strategy,
            liveness: self.liveness,
            storage_offset: self.storage_offset,
            resident_bytes: self.resident_bytes,
            slab_base,
            slab_bytes,
            load_bytes: self.load_bytes,
            peak_position: self.peak_position,
            total_bytes: slab_base + slab_bytes,
            offload: self.offload,
            host_bytes: self.host_bytes,
        })
    }
}

/// The slab's placement items in storage order: each slab storage alone, except the storages
/// of an all-reduce's outputs, which form one item at the position of their first storage, laid
/// out in output order, each at an aligned offset right after the previous one, so that the
/// collective runs on one contiguous region. A graph without all-reduce gets one item per slab
/// storage, in the order (and so the plan) it always had.
fn slab_items(g: &Graph, liveness: &Liveness) -> Result<Vec<Vec<(usize, usize)>>, PlanError> {
    let n = liveness.storages.len();
    let mut group_of: Vec<Option<usize>> = vec![None; n];
    let mut groups: Vec<Vec<(usize, usize)>> = Vec::new();
    let kernel_outputs = g.kernel_outputs();
    for id in g.ids() {
        if !matches!(g.node(id).op, crate::ir::Op::AllReduce { .. }) {
            continue;
        }
        let mut item = Vec::new();
        let mut at = 0usize;
        for &o in &kernel_outputs[id.index()] {
            let s = liveness.storage_of[o.index()];
            let bad = |reason: String| PlanError::Bucket { node: id, reason };
            if liveness.storages[s].region != Region::Slab {
                return Err(bad(format!("its output {o} is not in the slab")));
            }
            if group_of[s].is_some() {
                return Err(bad(format!(
                    "its output {o} shares storage with another bucket member (two gradients of                      one bucket are the same bytes)"
                )));
            }
            group_of[s] = Some(groups.len());
            item.push((s, at));
            at += align_up(liveness.storages[s].bytes);
        }
        groups.push(item);
    }
    let mut items = Vec::with_capacity(n);
    for (i, s) in liveness.storages.iter().enumerate() {
        if s.region != Region::Slab {
            continue;
        }
        match group_of[i] {
            None => items.push(vec![(i, 0)]),
            Some(k) => {
                // The first member met emits the whole group; later members find it taken.
                let group = std::mem::take(&mut groups[k]);
                if !group.is_empty() {
                    items.push(group);
                }
            }
        }
    }
    Ok(items)
}

/// LOAD of an interval problem and the first position where it is reached.
fn load_and_peak(p: &dsa::Problem) -> (usize, usize) {
    let mut events: Vec<(u64, i64)> = Vec::with_capacity(p.buffers.len() * 2);
    for b in &p.buffers {
        events.push((b.lower, b.size as i64));
        events.push((b.upper, -(b.size as i64)));
    }
    // At equal positions, ends come before starts: intervals are half-open.
    events.sort_by_key(|&(t, d)| (t, d));
    let (mut live, mut best, mut at) = (0i64, 0i64, 0u64);
    for (t, d) in events {
        live += d;
        if live > best {
            best = live;
            at = t;
        }
    }
    (best as usize, at as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, Init};

    #[test]
    fn an_update_to_the_value_its_target_holds_orders_nothing_and_plans() {
        // `update w = w` (a gradient simplified to zero) while another output reads w.
        let mut g = Graph::new();
        let w = g.parameter("w", [4], DType::F32, Init::Ones).unwrap();
        let x = g.input("x", [4], DType::F32).unwrap();
        let y = g.mul(w, x).unwrap();
        g.set_output("loss", y).unwrap();
        g.set_update(w, w).unwrap();
        let p = plan(&g, &PlanOptions::default()).unwrap();
        assert_eq!(p.liveness.order.len(), g.len());
        assert!(p.liveness.copies.is_empty());
    }

    #[test]
    fn an_update_whose_old_value_is_read_after_its_new_one_is_written_aside_and_copied() {
        // The old value of w is read by a node that needs the new one: no order can write the
        // new value over the old in place, so it is written aside and copied at the step's end.
        let mut g = Graph::new();
        let w = g.parameter("w", [4], DType::F32, Init::Ones).unwrap();
        let x = g.input("x", [4], DType::F32).unwrap();
        let new = g.add(w, x).unwrap();
        let late = g.mul(new, w).unwrap();
        g.set_output("loss", late).unwrap();
        g.set_update(w, new).unwrap();
        let p = plan(&g, &PlanOptions::default()).unwrap();
        assert_eq!(p.liveness.order.len(), g.len(), "every node is scheduled");
        assert_eq!(p.liveness.copies.len(), 1, "{:?}", p.liveness.copies);
    }
}
