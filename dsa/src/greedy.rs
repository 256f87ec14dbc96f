//! Greedy placement: fast, good, and the starting point of every solve.
//!
//! Fit heuristics in the manner of XLA's heap simulator: take buffers in a fixed order
//! (decreasing size, decreasing lifetime, ...) and put each into a free gap of the region it
//! must avoid (the union of the byte ranges of already placed buffers that are live at some
//! moment of its lifetime): the smallest gap that fits (best fit) or the lowest (first fit).
//! (The portfolio's other family, skyline dives, lives in [`super::dive`].)
//!
//! The fit heuristics need "which placed buffers meet my lifetime, and where": a segment tree
//! over (compressed) time in which every node keeps the union of occupied byte ranges as a
//! sorted list of disjoint ranges, coalesced. Dense packings coalesce into a few ranges, so a
//! query touches `O(log T)` short lists instead of every overlapping buffer.

use super::Instance;
use crate::clock::Deadline;

/// How a fit heuristic chooses among the gaps a buffer fits into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// The smallest gap that holds the buffer; ties go to the lowest.
    Best,
    /// The lowest gap that holds the buffer.
    First,
}

/// Inserts `[a, b)` into a sorted list of disjoint, non-adjacent ranges, merging as needed.
fn add_range(v: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    let i = v.partition_point(|r| r.1 < a);
    let j = v.partition_point(|r| r.0 <= b);
    if i == j {
        v.insert(i, (a, b));
    } else {
        let na = a.min(v[i].0);
        let nb = b.max(v[j - 1].1);
        v[i] = (na, nb);
        v.drain(i + 1..j);
    }
}

/// Occupied byte ranges over compressed time, for fit queries.
struct Occupancy {
    leaves: usize,
    /// `cover[v]`: union of byte ranges of buffers whose lifetime covers node `v` entirely
    /// (stored at the canonical nodes of their lifetime).
    cover: Vec<Vec<(u64, u64)>>,
    /// `sub[v]`: union of byte ranges of buffers stored at `v`, or at a descendant of `v`, or on
    /// a boundary path through `v`; every one of them meets `v`'s time range.
    sub: Vec<Vec<(u64, u64)>>,
    /// For the top nodes only (`v < CACHED`): the union of `cover` over `v` and its ancestors,
    /// kept lazily. Long-lived buffers sit high in the tree, so without this every query would
    /// gather them again.
    path_union: Vec<Vec<(u64, u64)>>,
    /// When `path_union[v]` was computed, and when `cover[v]` last changed (one shared clock);
    /// `path_union[v]` is current when newer than its own cover and its parent's union.
    path_stamp: Vec<u64>,
    cover_stamp: Vec<u64>,
    tick: u64,
}

/// Nodes whose path unions are cached (the top ten levels).
const CACHED: usize = 1 << 10;

/// The union of two sorted lists of disjoint ranges, coalesced, into `out`.
fn union_into(a: &[(u64, u64)], b: &[(u64, u64)], out: &mut Vec<(u64, u64)>) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = if j == b.len() || (i < a.len() && a[i].0 <= b[j].0) {
            i += 1;
            a[i - 1]
        } else {
            j += 1;
            b[j - 1]
        };
        match out.last_mut() {
            Some(last) if next.0 <= last.1 => last.1 = last.1.max(next.1),
            _ => out.push(next),
        }
    }
}

impl Occupancy {
    fn new(slots: usize) -> Self {
        let leaves = slots.max(1).next_power_of_two();
        let cached = CACHED.min(2 * leaves);
        Occupancy {
            leaves,
            cover: vec![Vec::new(); 2 * leaves],
            sub: vec![Vec::new(); 2 * leaves],
            path_union: vec![Vec::new(); cached],
            path_stamp: vec![0; cached],
            cover_stamp: vec![0; cached],
            tick: 0,
        }
    }

    fn add_cover(&mut self, v: usize, a: u64, b: u64) {
        add_range(&mut self.cover[v], a, b);
        if v < self.cover_stamp.len() {
            self.tick += 1;
            self.cover_stamp[v] = self.tick;
        }
    }

    /// Brings `path_union` up to date from the root down to cached node `v`.
    fn refresh_path(&mut self, v: usize) {
        let depth = usize::BITS - 1 - v.leading_zeros();
        let mut scratch = Vec::new();
        for d in 0..=depth {
            let u = v >> (depth - d);
            let parent_stamp = if u > 1 { self.path_stamp[u >> 1] } else { 0 };
            let stamp = self.path_stamp[u];
            if stamp != 0 && stamp > self.cover_stamp[u] && stamp > parent_stamp {
                continue;
            }
            if u > 1 {
                union_into(&self.path_union[u >> 1], &self.cover[u], &mut scratch);
                std::mem::swap(&mut self.path_union[u], &mut scratch);
            } else {
                self.path_union[u].clone_from(&self.cover[u]);
            }
            self.tick += 1;
            self.path_stamp[u] = self.tick;
        }
    }

    /// Records bytes `[a, b)` as occupied over slots `[lo, hi)`.
    fn insert(&mut self, lo: usize, hi: usize, a: u64, b: u64) {
        let p = self.leaves;
        let (mut x, mut y) = (lo + p, hi - 1 + p);
        while x != y {
            add_range(&mut self.sub[x], a, b);
            add_range(&mut self.sub[y], a, b);
            x >>= 1;
            y >>= 1;
        }
        while x >= 1 {
            add_range(&mut self.sub[x], a, b);
            x >>= 1;
        }
        let (mut l, mut r) = (lo + p, hi + p);
        while l < r {
            if l & 1 == 1 {
                self.add_cover(l, a, b);
                add_range(&mut self.sub[l], a, b);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.add_cover(r, a, b);
                add_range(&mut self.sub[r], a, b);
            }
            l >>= 1;
            r >>= 1;
        }
    }

    /// Appends to `out` byte ranges whose union is exactly the bytes occupied, at some moment of
    /// slots `[lo, hi)`, by inserted buffers.
    /// The cached part comes back as a separate sorted slice (`path_union` of the top node).
    fn query(&mut self, lo: usize, hi: usize, out: &mut Vec<(u64, u64)>) -> usize {
        let p = self.leaves;
        // Covers of the strict ancestors of both boundary leaves, common ancestors once, the
        // cached top of the tree as one list.
        let (mut a, mut b) = ((lo + p) >> 1, (hi - 1 + p) >> 1);
        while a != b {
            out.extend_from_slice(&self.cover[a]);
            out.extend_from_slice(&self.cover[b]);
            a >>= 1;
            b >>= 1;
        }
        while a >= self.path_union.len() {
            out.extend_from_slice(&self.cover[a]);
            a >>= 1;
        }
        if a >= 1 {
            self.refresh_path(a);
        }
        let (mut l, mut r) = (lo + p, hi + p);
        while l < r {
            if l & 1 == 1 {
                out.extend_from_slice(&self.sub[l]);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                out.extend_from_slice(&self.sub[r]);
            }
            l >>= 1;
            r >>= 1;
        }
        a
    }
}

#[inline]
pub(crate) fn align_up(x: u64, align: u64) -> u64 {
    match x % align {
        0 => x,
        r => x + (align - r),
    }
}

/// Places buffers in `order` with the given fit policy. Returns offsets (problem order) and
/// peak, or `None` if the deadline passed first.
pub(crate) fn fit(
    inst: &Instance,
    order: &[u32],
    policy: Fit,
    deadline: Option<Deadline>,
) -> Option<(Vec<u64>, u64)> {
    let mut occ = Occupancy::new(inst.slots);
    let mut offsets = vec![0u64; inst.n];
    let mut peak = 0u64;
    let mut scratch: Vec<(u64, u64)> = Vec::new();
    let align = inst.align;
    for (k, &b) in order.iter().enumerate() {
        if k % 1024 == 1023 && deadline.is_some_and(Deadline::passed) {
            return None;
        }
        let b = b as usize;
        let size = inst.size[b];
        if size == 0 {
            continue;
        }
        let (lo, hi) = (inst.lo[b] as usize, inst.hi[b] as usize);
        scratch.clear();
        let top_node = occ.query(lo, hi, &mut scratch);
        // A concatenation of sorted lists: the stable sort merges the runs it finds (2% fewer
        // instructions in the fits than the unstable sort at 200 layers of a narrow GPT, where
        // this sort is two thirds of their work: the ranges gathered grow with the live
        // buffers). The order of ranges with equal starts does not change the gaps walked.
        scratch.sort_by_key(|r| r.0);
        let cached: &[(u64, u64)] = if top_node >= 1 {
            &occ.path_union[top_node]
        } else {
            &[]
        };
        // Walk the gaps of the union, low to high, merging the two sorted lists.
        let mut chosen: Option<(u64, u64)> = None; // (gap size, offset)
        let mut cursor = 0u64; // bottom of the current gap
        let (mut i, mut j) = (0, 0);
        while i < scratch.len() || j < cached.len() {
            let (s, e) = if j == cached.len() || (i < scratch.len() && scratch[i].0 <= cached[j].0)
            {
                i += 1;
                scratch[i - 1]
            } else {
                j += 1;
                cached[j - 1]
            };
            if s > cursor {
                let at = align_up(cursor, align);
                if at + size <= s {
                    let gap = s - cursor;
                    match policy {
                        Fit::First => {
                            chosen = Some((gap, at));
                            break;
                        }
                        Fit::Best => {
                            if chosen.is_none_or(|(g, _)| gap < g) {
                                chosen = Some((gap, at));
                            }
                        }
                    }
                }
            }
            cursor = cursor.max(e);
        }
        let at = match chosen {
            Some((_, at)) => at,
            None => align_up(cursor, align),
        };
        offsets[b] = at;
        peak = peak.max(at + size);
        occ.insert(lo, hi, at, at + size);
    }
    Some((offsets, peak))
}
