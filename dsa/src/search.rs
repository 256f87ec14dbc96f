//! Exact search for an assignment under a capacity, after MiniMalloc (Moffitt, ASPLOS 2023).
//!
//! The search places buffers one at a time, depth first, always at the lowest offset the
//! buffer can take above the placed buffers it meets, and only in **canonical order**: offsets
//! never decrease along a branch (ties in offset go in preorder). Every packing can be pushed
//! down until each buffer rests on one it meets, and then listed by offset, so nothing is lost;
//! but each packing is visited once instead of `n!` times. On top of that:
//!
//! * **Dynamic ordering**: at each node the candidates are the unplaced buffers sorted by lowest
//!   feasible offset, then by a static preorder (MiniMalloc's `WAT`, `TAW`, `TWA`: lifetime,
//!   area, section total in some priority).
//! * **Dominance**: a candidate whose offset is at or above the lowest top any unplaced buffer
//!   could reach is skipped: that buffer could drop into the gap below it, so some canonical
//!   packing places it first.
//! * **Inference**: time is cut into *sections* (the distinct sets of buffers live together just
//!   before some buffer dies). A section's floor is the top of its placed buffers, raised to the
//!   lowest feasible offset of its unplaced ones and to the current offset (which never falls).
//!   Floor plus the unplaced size still live there must fit the capacity, or the branch is cut.
//! * **Decomposition**: when every buffer spanning a boundary between two sections is placed,
//!   the two sides are independent and are searched separately.
//! * **Round robin**: the three preorders take turns under a node limit that doubles, so a bad
//!   preorder cannot stall the search.

use super::dive::{dive, DiveResult, DiveSetup};
use super::greedy::align_up;
use super::{Instance, Solution, LARGE_PROBLEM};
use crate::clock::Deadline;

const NONE: u64 = u64::MAX;

/// The outcome of improving a solution.
pub(crate) struct Outcome {
    /// A solution better than the one given, if one was found.
    pub solution: Option<Solution>,
    /// A lower bound on the optimal peak proved along the way (at least LOAD).
    pub lower_bound: u64,
    pub nodes: u64,
    pub budget_exhausted: bool,
}

impl Outcome {
    /// Nothing found yet: no better solution, LOAD as the lower bound, no node searched.
    fn at_load(inst: &Instance) -> Outcome {
        Outcome {
            solution: None,
            lower_bound: inst.load,
            nodes: 0,
            budget_exhausted: false,
        }
    }
}

/// What a search may spend and aims for: a capacity to fit (without one, the lowest peak it
/// finds), a deadline on the solving thread's CPU clock and a number of search nodes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub capacity: Option<u64>,
    pub deadline: Option<Deadline>,
    pub node_limit: u64,
}

/// The time structure the search works on.
pub(crate) struct Sweep {
    /// Buffers (with nonzero size) live in each section.
    sections: Vec<Vec<u32>>,
    /// Each buffer's section range `[sec_lo, sec_hi)` (empty for zero-size buffers).
    sec_lo: Vec<u32>,
    sec_hi: Vec<u32>,
    /// For each buffer, the buffers live at some common moment.
    overlaps: Vec<Vec<u32>>,
    /// Each section's members with their end slots, earliest end first, and with their first
    /// slots, latest first: a placement's raises reach the members that meet it, so the
    /// members of a section left (right) of it that could hold its floor down form a prefix
    /// of the first (second) list.
    by_end: Vec<Vec<(u32, u32)>>,
    by_start: Vec<Vec<(u32, u32)>>,
}

impl Sweep {
    /// Builds the sweep, or `None` when the overlap lists would exceed `max_pairs` entries.
    pub fn new(inst: &Instance, max_pairs: usize) -> Option<Sweep> {
        let n = inst.n;
        // Slot k is a section when some buffer's last slot is k.
        let mut is_section = vec![false; inst.slots];
        for b in 0..n {
            if inst.size[b] > 0 {
                is_section[inst.hi[b] as usize - 1] = true;
            }
        }
        // first_section[k]: index of the first section at or after slot k.
        let mut first_section = vec![0u32; inst.slots + 1];
        let mut count = 0u32;
        for k in 0..inst.slots {
            first_section[k] = count;
            if is_section[k] {
                count += 1;
            }
        }
        first_section[inst.slots] = count;
        let mut sections: Vec<Vec<u32>> = vec![Vec::new(); count as usize];
        let mut sec_lo = vec![0u32; n];
        let mut sec_hi = vec![0u32; n];
        for b in 0..n {
            if inst.size[b] == 0 {
                continue;
            }
            sec_lo[b] = first_section[inst.lo[b] as usize];
            sec_hi[b] = first_section[inst.hi[b] as usize];
            for s in sec_lo[b]..sec_hi[b] {
                sections[s as usize].push(b as u32);
            }
        }
        // Overlaps: sweep buffers by start, keeping the live ones.
        let mut by_lo: Vec<u32> = (0..n as u32)
            .filter(|&b| inst.size[b as usize] > 0)
            .collect();
        by_lo.sort_by_key(|&b| (inst.lo[b as usize], b));
        let mut overlaps: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut live: Vec<u32> = Vec::new();
        let mut pairs = 0usize;
        for &b in &by_lo {
            let lo = inst.lo[b as usize];
            live.retain(|&o| inst.hi[o as usize] > lo);
            pairs += 2 * live.len();
            if pairs > max_pairs {
                return None;
            }
            for &o in &live {
                overlaps[b as usize].push(o);
                overlaps[o as usize].push(b);
            }
            live.push(b);
        }
        for v in overlaps.iter_mut() {
            v.sort_unstable();
        }
        let keyed = |slot: &[u32], rev: bool| -> Vec<Vec<(u32, u32)>> {
            sections
                .iter()
                .map(|m| {
                    let mut m: Vec<(u32, u32)> = m.iter().map(|&b| (slot[b as usize], b)).collect();
                    m.sort_unstable();
                    if rev {
                        m.reverse();
                    }
                    m
                })
                .collect()
        };
        let by_end = keyed(&inst.hi, false);
        let by_start = keyed(&inst.lo, true);
        Some(Sweep {
            sections,
            sec_lo,
            sec_hi,
            overlaps,
            by_end,
            by_start,
        })
    }
}

/// A static preorder: keys compared in turn, each larger-first; ties by buffer index.
#[derive(Clone, Copy)]
enum Key {
    /// Lifetime length.
    Width,
    /// Size times lifetime.
    Area,
    /// The largest unplaced total over the sections the buffer spans.
    Total,
}

const HEURISTICS: [[Key; 3]; 3] = [
    [Key::Width, Key::Area, Key::Total],
    [Key::Total, Key::Area, Key::Width],
    [Key::Total, Key::Width, Key::Area],
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Status {
    Found,
    NotFound,
    /// Node budget or deadline reached.
    Aborted,
}

/// One search at a fixed capacity.
struct Search<'a> {
    inst: &'a Instance,
    sw: &'a Sweep,
    cap: u64,
    heuristic: [Key; 3],
    assigned: Vec<u64>,
    solution: Vec<u64>,
    /// Each unplaced buffer's lowest feasible offset; `NONE` for a placed buffer, so that the
    /// hot loops (the candidates' ordering, the raises, the sections' floors) read one array
    /// where they read `assigned` and this one before.
    min_off: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    cuts: Vec<u32>,
    nodes: u64,
    node_budget: u64,
    deadline: Option<Deadline>,
    timed_out: bool,
    /// Per section, a member that last showed the floor cannot rise (a hint, checked on use).
    witness: Vec<u32>,
    pool_ordering: Vec<Vec<Candidate>>,
    pool_log: Vec<Vec<(u32, u64)>>,
    scratch_raised: Vec<Candidate>,
}

/// A candidate in a node's ordering: its lowest feasible offset, its index in the preorder
/// (which breaks ties: the ordering is sorted by these two, and no two candidates share an
/// index) and the buffer itself (so that no lookup through the preorder is needed).
type Candidate = (u64, u32, u32);

struct Partition {
    buffers: Vec<u32>,
    sec_lo: u32,
    sec_hi: u32,
}

/// A node of the search: the partition searched, the parent's ordering of the candidates
/// (offset, preorder index, buffer), and the placement that made the node (its offset and
/// preorder index: placements go in canonical order).
#[derive(Clone, Copy)]
struct At<'p> {
    part: &'p Partition,
    parent: &'p [Candidate],
    last_off: u64,
    last_pre: u32,
}

/// The vectors one node's search works in, taken from the pools and given back: its ordering
/// and the logs of its placement.
struct Scratch {
    ordering: Vec<Candidate>,
    off_log: Vec<(u32, u64)>,
    sec_log: Vec<(u32, u64)>,
}

impl<'a> Search<'a> {
    fn new(inst: &'a Instance, sw: &'a Sweep, cap: u64, deadline: Option<Deadline>) -> Self {
        let s = sw.sections.len();
        let mut total = vec![0u64; s];
        for (t, sec) in total.iter_mut().zip(&sw.sections) {
            *t = sec.iter().map(|&b| inst.size[b as usize]).sum();
        }
        let mut cuts = vec![0u32; s.saturating_sub(1)];
        for b in 0..inst.n {
            for c in sw.sec_lo[b]..sw.sec_hi[b].saturating_sub(1) {
                cuts[c as usize] += 1;
            }
        }
        Search {
            inst,
            sw,
            cap,
            heuristic: HEURISTICS[0],
            assigned: vec![NONE; inst.n],
            solution: vec![0; inst.n],
            min_off: vec![0; inst.n],
            floor: vec![0; s],
            total,
            cuts,
            nodes: 0,
            node_budget: u64::MAX,
            deadline,
            timed_out: false,
            witness: sw.sections.iter().map(|m| m[0]).collect(),
            pool_ordering: Vec::new(),
            pool_log: Vec::new(),
            scratch_raised: Vec::new(),
        }
    }

    /// Solves every buffer (with nonzero size) under the capacity.
    fn run(&mut self) -> Status {
        let s = self.sw.sections.len() as u32;
        if s == 0 {
            return Status::Found;
        }
        // Sections whose own load exceeds the capacity make the problem infeasible at once.
        if self.total.iter().any(|&t| t > self.cap) {
            return Status::NotFound;
        }
        let all: Vec<u32> = (0..self.inst.n as u32)
            .filter(|&b| self.inst.size[b as usize] > 0)
            .collect();
        let mut cutpoints = vec![0u32];
        cutpoints.extend(
            (0..s - 1)
                .filter(|&c| self.cuts[c as usize] == 0)
                .map(|c| c + 1),
        );
        cutpoints.push(s);
        self.solve_pieces(&all, &cutpoints)
    }

    /// Solves the unplaced buffers of `buffers` separately within each range between
    /// consecutive `cutpoints`.
    fn solve_pieces(&mut self, buffers: &[u32], cutpoints: &[u32]) -> Status {
        for w in cutpoints.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            let part: Vec<u32> = buffers
                .iter()
                .copied()
                .filter(|&b| {
                    let b = b as usize;
                    self.assigned[b] == NONE && self.sw.sec_lo[b] < hi && lo < self.sw.sec_hi[b]
                })
                .collect();
            if part.is_empty() {
                continue;
            }
            let status = self.sub_solve(Partition {
                buffers: part,
                sec_lo: lo,
                sec_hi: hi,
            });
            if status != Status::Found {
                return status;
            }
        }
        Status::Found
    }

    fn sub_solve(&mut self, part: Partition) -> Status {
        let inst = self.inst;
        let keyed: Vec<([u128; 3], u32)> = part
            .buffers
            .iter()
            .map(|&b| {
                let bi = b as usize;
                let mut k = [0u128; 3];
                for (slot, key) in k.iter_mut().zip(self.heuristic) {
                    *slot = match key {
                        Key::Width => inst.length[bi] as u128,
                        Key::Area => inst.length[bi] as u128 * inst.size[bi] as u128,
                        Key::Total => (self.sw.sec_lo[bi]..self.sw.sec_hi[bi])
                            .map(|s| self.total[s as usize])
                            .max()
                            .unwrap_or(0) as u128,
                    };
                }
                (k, b)
            })
            .collect();
        let mut keyed = keyed;
        keyed.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let pre: Vec<u32> = keyed.iter().map(|k| k.1).collect();
        let ordering: Vec<Candidate> = pre
            .iter()
            .enumerate()
            .map(|(i, &b)| (0, i as u32, b))
            .collect();
        self.search(At {
            part: &part,
            parent: &ordering,
            last_off: 0,
            last_pre: 0,
        })
    }

    fn out_of_budget(&mut self) -> bool {
        if self.nodes >= self.node_budget {
            return true;
        }
        if self.nodes & 255 == 0 {
            if let Some(d) = self.deadline {
                if d.passed() {
                    self.timed_out = true;
                }
            }
        }
        self.timed_out
    }

    fn search(&mut self, at: At<'_>) -> Status {
        if self.out_of_budget() {
            return Status::Aborted;
        }
        self.nodes += 1;
        // Scratch vectors come from pools: a search allocates almost nothing per node.
        let mut scratch = Scratch {
            ordering: self.pool_ordering.pop().unwrap_or_default(),
            off_log: self.pool_log.pop().unwrap_or_default(),
            sec_log: self.pool_log.pop().unwrap_or_default(),
        };
        let status = self.search_with(at, &mut scratch);
        self.pool_ordering.push(scratch.ordering);
        self.pool_log.push(scratch.off_log);
        self.pool_log.push(scratch.sec_log);
        status
    }

    fn search_with(&mut self, at: At<'_>, scratch: &mut Scratch) -> Status {
        let At {
            part,
            parent,
            last_off,
            last_pre,
        } = at;
        let Scratch {
            ordering,
            off_log,
            sec_log,
        } = scratch;
        let inst = self.inst;
        // The parent's ordering, less the buffer just placed, with raised offsets moved: the
        // entries that kept their offset stay sorted, the raised ones are sorted apart (few, and
        // all at one offset) and merged in.
        ordering.clear();
        let mut raised = std::mem::take(&mut self.scratch_raised);
        raised.clear();
        for &(o, p, b) in parent {
            // Placed buffers have no offset left (`NONE`).
            let m = self.min_off[b as usize];
            if m == o {
                ordering.push((o, p, b));
            } else if m != NONE {
                raised.push((m, p, b));
            }
        }
        if !raised.is_empty() {
            raised.sort_unstable();
            merge_into(ordering, &raised);
        }
        self.scratch_raised = raised;
        if ordering.is_empty() {
            return Status::Found;
        }
        let min_height = ordering
            .iter()
            .map(|&(o, _, b)| o + inst.size[b as usize])
            .min()
            .unwrap_or(NONE);
        // Inference, the part that does not depend on which buffer goes next: offsets only
        // rise, so after placing any buffer at `off`, each section still needs its unplaced
        // total above `off` (the buffer placed, if it lives there, fills the bottom of it).
        let max_total = self.total[part.sec_lo as usize..part.sec_hi as usize]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        let highest = self.cap.saturating_sub(max_total);
        for &(off, p, b) in ordering.iter() {
            if off >= min_height || off > highest {
                break; // dominated or over capacity, and so is everything after it
            }
            if off < last_off || (off == last_off && p < last_pre) {
                continue; // not canonical
            }
            let b = b as usize;
            if off + inst.size[b] > self.cap {
                continue;
            }
            off_log.clear();
            sec_log.clear();
            self.place(b, off, off_log, sec_log);
            let status = if self.check(b, sec_log) {
                let next = At {
                    part,
                    parent: ordering,
                    last_off: off,
                    last_pre: p,
                };
                self.descend(next, b)
            } else {
                Status::NotFound
            };
            self.unplace(b, off_log, sec_log);
            if status != Status::NotFound {
                return status;
            }
        }
        Status::NotFound
    }

    /// After placing `b`: split the partition if `b` closed a boundary, else keep searching.
    fn descend(&mut self, next: At<'_>, b: usize) -> Status {
        let part = next.part;
        let (lo, hi) = (self.sw.sec_lo[b], self.sw.sec_hi[b]);
        let mut split = false;
        for c in lo..hi - 1 {
            self.cuts[c as usize] -= 1;
            split |= self.cuts[c as usize] == 0;
        }
        let status = if !split {
            self.search(next)
        } else {
            let mut cutpoints = vec![part.sec_lo];
            cutpoints.extend(
                (lo..hi - 1)
                    .filter(|&c| self.cuts[c as usize] == 0)
                    .map(|c| c + 1),
            );
            cutpoints.push(part.sec_hi);
            self.solve_pieces(&part.buffers, &cutpoints)
        };
        for c in lo..hi - 1 {
            self.cuts[c as usize] += 1;
        }
        status
    }

    #[inline(never)]
    fn place(
        &mut self,
        b: usize,
        off: u64,
        off_log: &mut Vec<(u32, u64)>,
        sec_log: &mut Vec<(u32, u64)>,
    ) {
        let inst = self.inst;
        let sw = self.sw;
        let size = inst.size[b];
        let top = off + size;
        self.assigned[b] = off;
        self.solution[b] = off;
        // `b` leaves the unplaced buffers: its lowest offset is logged first, restored last.
        off_log.push((b as u32, self.min_off[b]));
        self.min_off[b] = NONE;
        let raised = align_up(top, inst.align);
        // Every buffer raised meets `b`, so the sections whose floor may rise form one range
        // around `b`'s span: from the lowest raised start to the highest raised end.
        let (mut lo, mut hi) = (sw.sec_lo[b], sw.sec_hi[b]);
        for &o in &sw.overlaps[b] {
            let o = o as usize;
            // Placed buffers (`NONE`) are never below `raised`.
            if self.min_off[o] < raised {
                off_log.push((o as u32, self.min_off[o]));
                self.min_off[o] = raised;
                lo = lo.min(sw.sec_lo[o]);
                hi = hi.max(sw.sec_hi[o]);
            }
        }
        for s in sw.sec_lo[b]..sw.sec_hi[b] {
            let s = s as usize;
            sec_log.push((s as u32, self.floor[s]));
            self.floor[s] = top;
            self.total[s] -= size;
        }
        // A section's floor is at least the lowest feasible offset of its unplaced buffers.
        // Sections `b` spans now have floor `top`, and their lowest unplaced offset is at most
        // `raised` (every unplaced one there was raised to it), so unless alignment rounded
        // `raised` above `top` they cannot rise. Elsewhere, a floor at `raised` or above
        // cannot rise either.
        let skip = if raised == top {
            sw.sec_lo[b]..sw.sec_hi[b]
        } else {
            0..0
        };
        for s in (lo..hi).filter(|s| !skip.contains(s)) {
            let s = s as usize;
            let floor = self.floor[s];
            if floor >= raised {
                continue;
            }
            // Try last time's witness first: an unplaced member no higher than the floor.
            let w = self.witness[s] as usize;
            if self.min_off[w] <= floor {
                continue;
            }
            let lowest = self.lowest_unplaced(b, s, floor, raised);
            if lowest != NONE {
                sec_log.push((s as u32, floor));
                self.floor[s] = lowest;
            }
        }
    }

    /// Section `s`'s lowest unplaced offset after `b`'s placement raised the buffers it meets
    /// to `raised` (above `floor`, the section's floor), or `NONE` when the floor cannot rise
    /// (an unplaced member at or below it; recorded as the section's witness) or nothing is
    /// unplaced there.
    ///
    /// Outside `b`'s span only members that do not meet `b` can be at or below the floor
    /// (those that meet it are now at `raised` or above), and some member that meets `b` was
    /// raised to `raised` (`s` lies in the range the raises span, every raised buffer's span
    /// reaching `b`'s): so the answer is `raised` or the lowest of the members that do not
    /// meet `b`, a prefix of the section's members by end (left of `b`) or by start (right of
    /// it). Inside `b`'s span every member meets `b`, and all are read.
    fn lowest_unplaced(&mut self, b: usize, s: usize, floor: u64, raised: u64) -> u64 {
        let inst = self.inst;
        let sw = self.sw;
        let (lo_b, hi_b) = (inst.lo[b], inst.hi[b]);
        // Placed members read `NONE`: they neither hold the floor down nor set it.
        let mut visit = |o: u32, lowest: &mut u64| -> bool {
            let m = self.min_off[o as usize];
            if m <= floor {
                self.witness[s] = o;
                return false; // cannot rise
            }
            *lowest = (*lowest).min(m);
            true
        };
        let mut lowest = raised;
        if (s as u32) < sw.sec_lo[b] {
            for &(_, o) in sw.by_end[s].iter().take_while(|&&(hi, _)| hi <= lo_b) {
                if !visit(o, &mut lowest) {
                    return NONE;
                }
            }
        } else if (s as u32) >= sw.sec_hi[b] {
            for &(_, o) in sw.by_start[s].iter().take_while(|&&(lo, _)| lo >= hi_b) {
                if !visit(o, &mut lowest) {
                    return NONE;
                }
            }
        } else {
            lowest = NONE;
            for &o in &sw.sections[s] {
                if !visit(o, &mut lowest) {
                    return NONE;
                }
            }
        }
        #[cfg(test)]
        {
            // The reference: every member read.
            let mut every = NONE;
            for &o in &sw.sections[s] {
                let m = self.min_off[o as usize];
                assert!(
                    m > floor,
                    "section {s}: a member at or below the floor was missed"
                );
                every = every.min(m);
            }
            assert_eq!(lowest, every, "section {s}: the lowest unplaced offset");
        }
        lowest
    }

    #[inline(never)]
    fn unplace(&mut self, b: usize, off_log: &[(u32, u64)], sec_log: &[(u32, u64)]) {
        for &(s, f) in sec_log.iter().rev() {
            self.floor[s as usize] = f;
        }
        let size = self.inst.size[b];
        for s in self.sw.sec_lo[b]..self.sw.sec_hi[b] {
            self.total[s as usize] += size;
        }
        for &(o, m) in off_log.iter().rev() {
            self.min_off[o as usize] = m;
        }
        self.assigned[b] = NONE;
    }

    /// The rest of the inference, after placing `b` at `off`: every section must fit its
    /// floor plus the unplaced size still live there. Sections `b` spans are covered by the
    /// test in [`Search::search_with`] (floor `off + size`, total down by `size`); sections
    /// not touched did not change since the parent passed; what is left are the sections whose
    /// floor this placement raised, logged after `b`'s span.
    #[inline(never)]
    fn check(&self, b: usize, sec_log: &[(u32, u64)]) -> bool {
        let span = (self.sw.sec_hi[b] - self.sw.sec_lo[b]) as usize;
        sec_log[span..]
            .iter()
            .all(|&(s, _)| self.floor[s as usize] + self.total[s as usize] <= self.cap)
    }
}

/// Merges sorted `extra` into sorted `v`, from the back, in place.
fn merge_into(v: &mut Vec<Candidate>, extra: &[Candidate]) {
    let kept = v.len();
    v.resize(kept + extra.len(), (0, 0, 0));
    let (mut i, mut j, mut k) = (kept, extra.len(), v.len());
    while j > 0 {
        k -= 1;
        if i > 0 && v[i - 1] > extra[j - 1] {
            v[k] = v[i - 1];
            i -= 1;
        } else {
            v[k] = extra[j - 1];
            j -= 1;
        }
    }
}

/// The result of one capacity probe.
enum Probe {
    Found(Vec<u64>),
    Infeasible,
    Aborted,
}

/// Searches for an assignment with peak at most `cap`, the preorders taking turns under a node
/// limit that doubles from `2n` until `node_budget` nodes are spent in total.
fn probe(
    inst: &Instance,
    sw: &Sweep,
    cap: u64,
    node_budget: u64,
    deadline: Option<Deadline>,
    nodes: &mut u64,
    timed_out: &mut bool,
) -> Probe {
    let mut limit = 2 * inst.n as u64;
    let mut spent = 0u64;
    loop {
        for h in HEURISTICS {
            let remaining = node_budget.saturating_sub(spent);
            if remaining == 0 {
                return Probe::Aborted;
            }
            let mut s = Search::new(inst, sw, cap, deadline);
            s.heuristic = h;
            s.node_budget = limit.min(remaining);
            let status = s.run();
            spent += s.nodes;
            *nodes += s.nodes;
            if s.timed_out {
                *timed_out = true;
                return Probe::Aborted;
            }
            match status {
                Status::Found => {
                    let mut offsets = s.solution;
                    for (b, o) in offsets.iter_mut().enumerate() {
                        if inst.size[b] == 0 {
                            *o = 0;
                        }
                    }
                    return Probe::Found(offsets);
                }
                Status::NotFound => return Probe::Infeasible,
                Status::Aborted => {}
            }
        }
        limit = limit.saturating_mul(2);
    }
}

fn peak_of(inst: &Instance, offsets: &[u64]) -> u64 {
    (0..inst.n)
        .map(|b| offsets[b] + inst.size[b])
        .max()
        .unwrap_or(0)
}

/// Most overlap-list entries the search will build (memory and per-node time grow with it).
const MAX_PAIRS: usize = 4_000_000;

/// Improvement for large problems: capacity-aware dives ([`dive`]) under the three preorders,
/// at LOAD first, then bisecting between what failed and the best peak found. A failed dive
/// proves nothing, so the lower bound stays LOAD.
pub(crate) fn improve_by_dives(inst: &Instance, best: &Solution, limits: Limits) -> Outcome {
    let mut out = Outcome::at_load(inst);
    let setup = DiveSetup::new(inst, true);
    let totals: Vec<u64> = (0..inst.n).map(|b| setup.section_total(inst, b)).collect();
    let ranks: Vec<Vec<u32>> = HEURISTICS
        .iter()
        .map(|h| {
            let mut order: Vec<u32> = (0..inst.n as u32).collect();
            order.sort_by_cached_key(|&b| {
                let b_ = b as usize;
                let key = h.map(|k| match k {
                    Key::Width => inst.length[b_] as u128,
                    Key::Area => inst.length[b_] as u128 * inst.size[b_] as u128,
                    Key::Total => totals[b_] as u128,
                });
                (std::cmp::Reverse(key), b)
            });
            let mut rank = vec![0u32; inst.n];
            for (r, &b) in order.iter().enumerate() {
                rank[b as usize] = r as u32;
            }
            rank
        })
        .collect();
    // Tries every preorder at capacity `c`; the first packing found wins.
    let attempt = |c: u64, out: &mut Outcome| -> Option<Option<Vec<u64>>> {
        for rank in &ranks {
            if out.nodes >= limits.node_limit {
                return None;
            }
            match dive(inst, &setup, c, rank, limits.deadline, &mut out.nodes) {
                DiveResult::Found(o) => return Some(Some(o)),
                DiveResult::Failed => {}
                DiveResult::Aborted => return None,
            }
        }
        Some(None)
    };
    let targets: Vec<u64> = match limits.capacity {
        Some(c) => vec![c],
        None => vec![],
    };
    if !targets.is_empty() {
        match attempt(targets[0], &mut out) {
            Some(Some(o)) => {
                let peak = peak_of(inst, &o);
                out.solution = Some(Solution { offsets: o, peak });
            }
            Some(None) => {}
            None => out.budget_exhausted = true,
        }
        return out;
    }
    let mut ub = best.peak;
    let (mut lo, mut hi) = (inst.load, best.peak.saturating_sub(1));
    let mut first = true;
    while lo <= hi && lo < ub {
        let c = if first { lo } else { lo + (hi - lo) / 2 };
        first = false;
        match attempt(c, &mut out) {
            Some(Some(o)) => {
                ub = peak_of(inst, &o);
                out.solution = Some(Solution {
                    offsets: o,
                    peak: ub,
                });
                if ub == 0 {
                    break;
                }
                hi = hi.min(ub - 1);
            }
            Some(None) => lo = c + 1,
            None => {
                out.budget_exhausted = true;
                break;
            }
        }
    }
    out
}

/// Improves `best`: with a capacity, until its peak fits it; without, toward LOAD.
pub(crate) fn improve(inst: &Instance, best: &Solution, limits: Limits) -> Outcome {
    let sweep = if inst.n <= LARGE_PROBLEM {
        Sweep::new(inst, MAX_PAIRS)
    } else {
        None
    };
    let Some(sw) = sweep else {
        let out = improve_by_dives(inst, best, limits);
        // The dives are heuristics: a capacity they could not meet, with budget left, goes to
        // the exact search for the rest of the budget, when the problem's overlaps fit in it
        // (the time limit, not the heuristics, decides when to give up).
        if limits.capacity.is_some() && out.solution.is_none() && !out.budget_exhausted {
            if let Some(sw) = Sweep::new(inst, MAX_PAIRS) {
                let rest = Limits {
                    node_limit: limits.node_limit.saturating_sub(out.nodes),
                    ..limits
                };
                let mut exact = exact(inst, &sw, best, rest);
                exact.nodes += out.nodes;
                return exact;
            }
        }
        return out;
    };
    exact(inst, &sw, best, limits)
}

/// [`improve_with`] on a thread whose stack is sized for the problem's recursion depth.
fn exact(inst: &Instance, sw: &Sweep, best: &Solution, limits: Limits) -> Outcome {
    // Deep recursion: run on a thread with a stack sized for the problem.
    let stack = (64 << 20).max(inst.n * 4096);
    // The search thread spends what is left of the deadline on its own clock.
    let left = limits.deadline.map(Deadline::left);
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(stack)
            .spawn_scoped(scope, move || {
                let deadline = left.map(Deadline::after);
                improve_with(inst, sw, best, Limits { deadline, ..limits })
            })
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .unwrap_or_else(|_| improve_with(inst, sw, best, limits))
    })
}

fn improve_with(inst: &Instance, sw: &Sweep, best: &Solution, limits: Limits) -> Outcome {
    let mut out = Outcome::at_load(inst);
    let mut timed_out = false;
    let mut ub = best.peak;
    let mut lb = inst.load;
    let record = |out: &mut Outcome, offsets: Vec<u64>| -> u64 {
        let peak = peak_of(inst, &offsets);
        out.solution = Some(Solution { offsets, peak });
        peak
    };
    if let Some(cap) = limits.capacity {
        // Fit the capacity; nothing more.
        let budget = limits.node_limit;
        match probe(
            inst,
            sw,
            cap,
            budget,
            limits.deadline,
            &mut out.nodes,
            &mut timed_out,
        ) {
            Probe::Found(o) => {
                record(&mut out, o);
            }
            Probe::Infeasible => out.lower_bound = cap + 1,
            Probe::Aborted => out.budget_exhausted = true,
        }
        return out;
    }
    // Minimize: rounds of binary search between the bounds, each probe limited to a node
    // budget that grows by 4x per round. A probe that runs out of nodes counts as "too hard
    // for now" and sends the search upward.
    let mut per_probe = 8 * inst.n as u64 + 1024;
    while lb < ub {
        let (mut lo, mut hi) = (lb, ub - 1);
        let mut first = true;
        while lo <= hi {
            // The first probe of a round tries the lower bound itself.
            let c = if first { lo } else { lo + (hi - lo) / 2 };
            first = false;
            let budget = per_probe.min(limits.node_limit.saturating_sub(out.nodes));
            if budget == 0 {
                out.budget_exhausted = true;
                break;
            }
            match probe(
                inst,
                sw,
                c,
                budget,
                limits.deadline,
                &mut out.nodes,
                &mut timed_out,
            ) {
                Probe::Found(o) => {
                    ub = record(&mut out, o);
                    if ub == 0 {
                        break;
                    }
                    hi = hi.min(ub - 1);
                }
                Probe::Infeasible => {
                    lb = lb.max(c + 1);
                    lo = c + 1;
                }
                Probe::Aborted => {
                    if timed_out {
                        break;
                    }
                    lo = c + 1;
                }
            }
        }
        if timed_out || out.nodes >= limits.node_limit {
            out.budget_exhausted = true;
            break;
        }
        per_probe = per_probe.saturating_mul(4);
    }
    out.lower_bound = lb;
    out
}
