//! The capacity-aware dive: the first descent of the [`super::search`] (canonical order,
//! dominance, section inference) without backtracking, built to scale to tens of thousands of
//! buffers.
//!
//! The recursive search keeps, per node, a sorted copy of the candidates and, per problem, the
//! pairwise overlap lists and section member lists: quadratic in time and memory for large
//! problems. The dive instead keeps
//!
//! * the exact lowest feasible offset of every unplaced buffer, raised as buffers are placed by
//!   enumerating the unplaced buffers a placement meets ([`LiveIndex`], an interval index over
//!   unplaced buffers);
//! * candidates in a heap keyed by (offset, preorder rank), and the lowest reachable top in a
//!   heap keyed by offset plus size; both hold lower bounds (offsets only rise in a dive) and
//!   are corrected lazily when popped;
//! * per section the floor (in a min tree, to find the sections a placement could lift) and the
//!   unplaced total (in a max tree, for the capacity test that does not depend on the buffer).
//!
//! At each step it takes candidates in order and places the first that passes the inference
//! (a candidate is rejected when, placed, it would lift some section's floor so high that the
//! unplaced buffers live there no longer fit). When no candidate passes, the dive fails at this
//! capacity; the caller tries another preorder or capacity.

use super::greedy::align_up;
use super::Instance;
use crate::clock::Deadline;
use std::collections::BTreeSet;

const NONE: u64 = u64::MAX;
const NO_BUFFER: u32 = u32::MAX;

/// Unplaced buffers, sorted by first slot, with a max tree over their end slots: answers "which
/// unplaced buffers are live at some moment of `[lo, hi)`" in time proportional to the answer.
struct LiveIndex {
    /// Buffers sorted by (first slot, index).
    by_lo: Vec<u32>,
    /// First slot of `by_lo[i]`.
    lo_of: Vec<u32>,
    /// Position of each buffer in `by_lo`.
    pos: Vec<u32>,
    leaves: usize,
    /// Max tree of end slots; 0 for placed buffers and padding.
    max_hi: Vec<u32>,
}

impl LiveIndex {
    /// Indexes `members`, buffer `b` live over slots `[lo[b], hi[b])`.
    fn new(lo: &[u32], hi: &[u32], members: &[u32]) -> Self {
        let mut by_lo = members.to_vec();
        by_lo.sort_unstable_by_key(|&b| (lo[b as usize], b));
        let lo_of: Vec<u32> = by_lo.iter().map(|&b| lo[b as usize]).collect();
        let mut pos = vec![u32::MAX; lo.len()];
        for (i, &b) in by_lo.iter().enumerate() {
            pos[b as usize] = i as u32;
        }
        let leaves = by_lo.len().max(1).next_power_of_two();
        let mut max_hi = vec![0u32; 2 * leaves];
        for (i, &b) in by_lo.iter().enumerate() {
            max_hi[leaves + i] = hi[b as usize];
        }
        for v in (1..leaves).rev() {
            max_hi[v] = max_hi[2 * v].max(max_hi[2 * v + 1]);
        }
        LiveIndex {
            by_lo,
            lo_of,
            pos,
            leaves,
            max_hi,
        }
    }

    fn remove(&mut self, b: usize) {
        self.set(b, 0);
    }

    /// Sets buffer `b`'s end slot in the tree (0: absent).
    fn set(&mut self, b: usize, hi: u32) {
        let mut v = self.leaves + self.pos[b] as usize;
        self.max_hi[v] = hi;
        v >>= 1;
        while v >= 1 {
            self.max_hi[v] = self.max_hi[2 * v].max(self.max_hi[2 * v + 1]);
            v >>= 1;
        }
    }

    /// Number of buffers whose first slot is below `slot`.
    fn prefix(&self, slot: u32) -> usize {
        self.lo_of.partition_point(|&l| l < slot)
    }

    /// Calls `f` on every unplaced buffer live at some slot of `[lo, hi)`, until `f` returns
    /// `false`.
    fn for_each_overlapping(
        &self,
        lo: u32,
        hi: u32,
        stack: &mut Vec<(usize, usize, usize)>,
        f: impl FnMut(u32) -> bool,
    ) {
        self.for_each_overlapping_from(0, lo, hi, stack, false, f)
    }

    /// As [`Self::for_each_overlapping`], only for buffers starting at `from` or later, and
    /// latest start first when `reverse`.
    fn for_each_overlapping_from(
        &self,
        from: u32,
        lo: u32,
        hi: u32,
        stack: &mut Vec<(usize, usize, usize)>,
        reverse: bool,
        mut f: impl FnMut(u32) -> bool,
    ) {
        let start = self.prefix(from);
        let limit = self.prefix(hi);
        if limit == 0 {
            return;
        }
        stack.clear();
        stack.push((1, 0, self.leaves));
        while let Some((v, nl, nr)) = stack.pop() {
            if nl >= limit || nr <= start || self.max_hi[v] <= lo {
                continue;
            }
            if nr - nl == 1 {
                if !f(self.by_lo[nl]) {
                    return;
                }
                continue;
            }
            let m = (nl + nr) / 2;
            // The child to visit first goes on the stack last.
            if reverse {
                stack.push((2 * v, nl, m));
                stack.push((2 * v + 1, m, nr));
            } else {
                stack.push((2 * v + 1, m, nr));
                stack.push((2 * v, nl, m));
            }
        }
    }
}

/// Section totals: range subtraction, global maximum.
struct TotalTree {
    leaves: usize,
    /// Largest total in the subtree, counting subtractions at this node and below.
    max: Vec<u64>,
    /// Subtracted from the whole subtree and not passed down.
    sub: Vec<u64>,
}

impl TotalTree {
    fn new(values: &[u64]) -> Self {
        let leaves = values.len().max(1).next_power_of_two();
        let mut max = vec![0u64; 2 * leaves];
        max[leaves..leaves + values.len()].copy_from_slice(values);
        for v in (1..leaves).rev() {
            max[v] = max[2 * v].max(max[2 * v + 1]);
        }
        TotalTree {
            leaves,
            max,
            sub: vec![0; 2 * leaves],
        }
    }

    fn subtract(&mut self, l: usize, r: usize, d: u64) {
        self.subtract_rec(1, 0, self.leaves, l, r, d);
    }

    fn subtract_rec(&mut self, v: usize, nl: usize, nr: usize, l: usize, r: usize, d: u64) {
        if r <= nl || nr <= l {
            return;
        }
        if l <= nl && nr <= r {
            self.sub[v] += d;
            self.max[v] -= d;
            return;
        }
        let m = (nl + nr) / 2;
        self.subtract_rec(2 * v, nl, m, l, r, d);
        self.subtract_rec(2 * v + 1, m, nr, l, r, d);
        self.max[v] = self.max[2 * v].max(self.max[2 * v + 1]) - self.sub[v];
    }

    fn global_max(&self) -> u64 {
        self.max[1]
    }
}

/// Section witnesses: for each section, an unplaced buffer live there whose lowest feasible
/// offset is at most the section's floor, proving the floor cannot lift; plus, for each buffer,
/// the sections it witnesses, and an index of the buffers that witness something.
struct Witnesses {
    of: Vec<u32>,
    /// Sections each buffer witnesses; entries go stale when a witness changes (skipped).
    lists: Vec<Vec<u32>>,
    count: Vec<u32>,
    /// Buffers witnessing at least one section, for overlap queries.
    index: LiveIndex,
    hi: Vec<u32>,
}

impl Witnesses {
    fn new(inst: &Instance, setup: &DiveSetup) -> Self {
        let n = inst.n;
        let mut index = LiveIndex::new(&inst.lo, &inst.hi, &setup.members);
        let mut lists = vec![Vec::new(); n];
        let mut count = vec![0u32; n];
        for (s, &w) in setup.ender.iter().enumerate() {
            lists[w as usize].push(s as u32);
            count[w as usize] += 1;
        }
        for &b in &setup.members {
            if count[b as usize] == 0 {
                index.set(b as usize, 0);
            }
        }
        Witnesses {
            of: setup.ender.clone(),
            lists,
            count,
            index,
            hi: inst.hi.clone(),
        }
    }

    fn set(&mut self, s: usize, w: u32) {
        let old = self.of[s];
        if old == w {
            return;
        }
        self.count[old as usize] -= 1;
        if self.count[old as usize] == 0 {
            self.index.set(old as usize, 0);
        }
        if self.count[w as usize] == 0 {
            self.index.set(w as usize, self.hi[w as usize]);
        }
        self.count[w as usize] += 1;
        self.of[s] = w;
        self.lists[w as usize].push(s as u32);
    }

    /// Appends (once per `epoch`) the sections `w` witnesses.
    fn collect(&mut self, w: u32, mark: &mut [u64], epoch: u64, out: &mut Vec<u32>) {
        let of = &self.of;
        let list = &mut self.lists[w as usize];
        list.retain(|&s| of[s as usize] == w);
        list.dedup();
        for &s in list.iter() {
            if mark[s as usize] != epoch {
                mark[s as usize] = epoch;
                out.push(s);
            }
        }
    }
}

/// A set of small integers (`0..n`) with insert, remove and minimum in a few word operations:
/// a bitset with summary levels (64-ary).
struct TieSet {
    levels: Vec<Vec<u64>>,
}

impl TieSet {
    fn new(n: usize) -> Self {
        let mut levels = Vec::new();
        let mut len = n.max(1);
        loop {
            let words = len.div_ceil(64);
            levels.push(vec![0u64; words]);
            if words == 1 {
                break;
            }
            len = words;
        }
        TieSet { levels }
    }

    fn insert(&mut self, mut t: usize) {
        for level in self.levels.iter_mut() {
            let was = level[t / 64];
            level[t / 64] |= 1 << (t % 64);
            if was != 0 {
                break;
            }
            t /= 64;
        }
    }

    fn remove(&mut self, mut t: usize) {
        for level in self.levels.iter_mut() {
            level[t / 64] &= !(1 << (t % 64));
            if level[t / 64] != 0 {
                break;
            }
            t /= 64;
        }
    }

    fn min(&self) -> Option<usize> {
        let top = self.levels.last().expect("at least one level");
        if top[0] == 0 {
            return None;
        }
        let mut t = 0;
        for level in self.levels.iter().rev() {
            t = t * 64 + level[t].trailing_zeros() as usize;
        }
        Some(t)
    }

    fn is_empty(&self) -> bool {
        self.levels.last().expect("at least one level")[0] == 0
    }
}

const ABSENT: u8 = 0;
const LEVEL: u8 = 1;
const BUCKET: u8 = 2;
const BELOW: u8 = 3;

/// An indexed min-priority queue of buffers keyed by `(key, tie[b])`, with exact updates, for
/// keys that mostly rise (offsets in a dive): a radix heap on the key (an entry moves down at
/// most 64 buckets in its life), a [`TieSet`] for the entries at the current key, and an ordered
/// set for the few keys that arrive below it (candidates put back after a rejection). Every
/// operation is a few word operations, except those on the ordered set.
struct ExactQueue {
    tie: Vec<u32>,
    by_tie: Vec<u32>,
    state: Vec<u8>,
    key: Vec<u64>,
    pos: Vec<u32>,
    last: u64,
    /// Bucket `i` (1..=64) holds keys whose highest bit differing from `last` is bit `i - 1`.
    buckets: Vec<Vec<u32>>,
    mask: u128,
    level: TieSet,
    below: BTreeSet<(u64, u32, u32)>,
}

impl ExactQueue {
    /// `tie` must be a permutation of `0..tie.len()`.
    fn new(tie: Vec<u32>) -> Self {
        let n = tie.len();
        let mut by_tie = vec![0u32; n];
        for (b, &t) in tie.iter().enumerate() {
            by_tie[t as usize] = b as u32;
        }
        ExactQueue {
            tie,
            by_tie,
            state: vec![ABSENT; n],
            key: vec![0; n],
            pos: vec![0; n],
            last: 0,
            buckets: vec![Vec::new(); 65],
            mask: 0,
            level: TieSet::new(n),
            below: BTreeSet::new(),
        }
    }

    fn contains(&self, b: usize) -> bool {
        self.state[b] != ABSENT
    }

    fn insert(&mut self, b: usize, key: u64) {
        debug_assert_eq!(self.state[b], ABSENT);
        self.key[b] = key;
        if key < self.last {
            self.below.insert((key, self.tie[b], b as u32));
            self.state[b] = BELOW;
        } else if key == self.last {
            self.level.insert(self.tie[b] as usize);
            self.state[b] = LEVEL;
        } else {
            let i = (64 - (key ^ self.last).leading_zeros()) as usize;
            self.pos[b] = self.buckets[i].len() as u32;
            self.buckets[i].push(b as u32);
            self.mask |= 1 << i;
            self.state[b] = BUCKET;
        }
    }

    fn remove(&mut self, b: usize) {
        match self.state[b] {
            LEVEL => self.level.remove(self.tie[b] as usize),
            BUCKET => {
                let i = (64 - (self.key[b] ^ self.last).leading_zeros()) as usize;
                let p = self.pos[b] as usize;
                let bucket = &mut self.buckets[i];
                bucket.swap_remove(p);
                if let Some(&moved) = bucket.get(p) {
                    self.pos[moved as usize] = p as u32;
                }
                if bucket.is_empty() {
                    self.mask &= !(1 << i);
                }
            }
            BELOW => {
                self.below.remove(&(self.key[b], self.tie[b], b as u32));
            }
            _ => {}
        }
        self.state[b] = ABSENT;
    }

    fn update(&mut self, b: usize, key: u64) {
        self.remove(b);
        self.insert(b, key);
    }

    /// Moves the entries with the smallest radix key to `level`, if `level` is empty.
    fn settle(&mut self) {
        if !self.level.is_empty() || self.mask == 0 {
            return;
        }
        let i = self.mask.trailing_zeros() as usize;
        let mut entries = std::mem::take(&mut self.buckets[i]);
        self.mask &= !(1 << i);
        self.last = entries
            .iter()
            .map(|&b| self.key[b as usize])
            .min()
            .expect("marked buckets are not empty");
        for &b in &entries {
            self.state[b as usize] = ABSENT;
            self.insert(b as usize, self.key[b as usize]);
        }
        entries.clear();
        if self.buckets[i].is_empty() {
            self.buckets[i] = entries; // keep the allocation
        }
    }

    /// The smallest `(key, tie, buffer)`.
    fn peek(&mut self) -> Option<(u64, u32, u32)> {
        self.settle();
        let radix = self
            .level
            .min()
            .map(|t| (self.last, t as u32, self.by_tie[t]));
        let below = self.below.first().copied();
        match (radix, below) {
            (Some(r), Some(x)) => Some(r.min(x)),
            (r, x) => r.or(x),
        }
    }

    fn pop(&mut self) -> Option<(u64, u32, u32)> {
        let first = self.peek()?;
        self.remove(first.2 as usize);
        Some(first)
    }
}

/// How a dive ended.
pub(crate) enum DiveResult {
    /// Every buffer placed within the capacity (offsets in problem order).
    Found(Vec<u64>),
    /// No candidate passed the inference after placing this many buffers.
    Failed,
    /// The deadline passed.
    Aborted,
}

/// The static data a dive needs, shared by dives at different capacities and preorders.
pub(crate) struct DiveSetup {
    /// Buffers with nonzero size.
    members: Vec<u32>,
    /// Section index of the first section at or after each slot.
    first_section: Vec<u32>,
    /// The slot of each section.
    section_slot: Vec<u32>,
    /// Initial unplaced total of each section.
    total: Vec<u64>,
    /// A buffer live in each section (one that ends there).
    ender: Vec<u32>,
    /// The buffers live in each section, when affordable (see [`MAX_MEMBER_ENTRIES`]).
    lists: Option<SectionLists>,
}

/// Most section-membership entries kept as flat lists (beyond, scans use the interval index:
/// slower, but memory stays linear).
const MAX_MEMBER_ENTRIES: usize = 12_000_000;

/// The buffers live in each section, twice: by first slot and by last slot (ascending), as
/// slices `[start[s], start[s + 1])` of one array each.
struct SectionLists {
    start: Vec<usize>,
    by_lo: Vec<u32>,
    by_hi: Vec<u32>,
}

impl SectionLists {
    fn new(inst: &Instance, members: &[u32], first_section: &[u32], nsec: usize) -> Option<Self> {
        let span = |b: u32| {
            let b = b as usize;
            (
                first_section[inst.lo[b] as usize] as usize,
                first_section[inst.hi[b] as usize] as usize,
            )
        };
        let mut diff = vec![0i64; nsec + 1];
        let mut entries = 0usize;
        for &b in members {
            let (l, h) = span(b);
            diff[l] += 1;
            diff[h] -= 1;
            entries += h - l;
        }
        if entries > MAX_MEMBER_ENTRIES {
            return None;
        }
        let mut start = vec![0usize; nsec + 1];
        let mut live = 0i64;
        for s in 0..nsec {
            live += diff[s];
            start[s + 1] = start[s] + live as usize;
        }
        let fill = |order: &[u32]| {
            let mut out = vec![0u32; entries];
            let mut next = start.clone();
            for &b in order {
                let (l, h) = span(b);
                for s in l..h {
                    out[next[s]] = b;
                    next[s] += 1;
                }
            }
            out
        };
        let mut order = members.to_vec();
        order.sort_unstable_by_key(|&b| (inst.lo[b as usize], b));
        let by_lo = fill(&order);
        order.sort_unstable_by_key(|&b| (inst.hi[b as usize], b));
        let by_hi = fill(&order);
        Some(SectionLists {
            start,
            by_lo,
            by_hi,
        })
    }
}

impl DiveSetup {
    /// `lists`: also build the section member lists (only the capacity tests need them).
    pub fn new(inst: &Instance, lists: bool) -> Self {
        let members: Vec<u32> = (0..inst.n as u32)
            .filter(|&b| inst.size[b as usize] > 0)
            .collect();
        let mut ends_at = vec![NO_BUFFER; inst.slots];
        for &b in &members {
            ends_at[inst.hi[b as usize] as usize - 1] = b;
        }
        let mut first_section = vec![0u32; inst.slots + 1];
        let mut section_slot = Vec::new();
        for k in 0..inst.slots {
            first_section[k] = section_slot.len() as u32;
            if ends_at[k] != NO_BUFFER {
                section_slot.push(k as u32);
            }
        }
        first_section[inst.slots] = section_slot.len() as u32;
        let total: Vec<u64> = section_slot
            .iter()
            .map(|&k| inst.slot_load[k as usize])
            .collect();
        let ender = section_slot.iter().map(|&k| ends_at[k as usize]).collect();
        let lists = if lists {
            SectionLists::new(inst, &members, &first_section, section_slot.len())
        } else {
            None
        };
        DiveSetup {
            members,
            first_section,
            section_slot,
            total,
            ender,
            lists,
        }
    }

    /// The largest initial section total over each buffer's lifetime (MiniMalloc's `T` key).
    pub fn section_total(&self, inst: &Instance, b: usize) -> u64 {
        let (lo, hi) = (
            self.first_section[inst.lo[b] as usize],
            self.first_section[inst.hi[b] as usize],
        );
        self.total[lo as usize..hi as usize]
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
    }
}

/// Dives at capacity `cap`, candidates tied in offset taken in increasing `rank`.
///
/// Section floors are lifted as in the search (a section's floor is at least the lowest
/// feasible offset of its unplaced buffers), tracked through *witnesses*: each section with
/// unplaced buffers keeps one whose lowest feasible offset is at most the floor, which proves
/// the floor cannot lift. A placement can only break the witnesses it raises, so only their
/// sections are examined: a new witness is searched for and, if none exists, the floor lifts
/// to the lowest offset there and must still leave room for the section's unplaced total.
pub(crate) fn dive(
    inst: &Instance,
    setup: &DiveSetup,
    cap: u64,
    rank: &[u32],
    deadline: Option<Deadline>,
    steps: &mut u64,
) -> DiveResult {
    if setup.total.iter().any(|&t| t > cap) {
        return DiveResult::Failed;
    }
    let mut state = Dive::new(inst, setup, cap, rank);
    let (mut last_off, mut last_rank) = (0u64, 0u32);
    for _ in 0..setup.members.len() {
        *steps += 1;
        if *steps & 31 == 0 && deadline.is_some_and(Deadline::passed) {
            return DiveResult::Aborted;
        }
        let (b, off, r) = match state.choose(last_off, last_rank, deadline) {
            Pick::Chosen(b, off, r) => (b, off, r),
            Pick::Failed => return DiveResult::Failed,
            Pick::Aborted => return DiveResult::Aborted,
        };
        state.place(b, off);
        last_off = off;
        last_rank = r;
    }
    DiveResult::Found(state.offsets)
}

/// What [`Dive::choose`] found: a buffer, its offset and rank; none that fits; or the deadline.
enum Pick {
    Chosen(u32, u64, u32),
    Failed,
    Aborted,
}

/// A candidate placement being checked: buffer `b` at an offset whose top is `top`.
struct Candidate {
    b: u32,
    /// Its slots `[blo, bhi)`, and the sections `[span_lo, span_hi)` they cover.
    blo: u32,
    bhi: u32,
    span_lo: usize,
    span_hi: usize,
    top: u64,
    /// `top` aligned: the least offset a buffer meeting `b` can take once it is placed.
    raised: u64,
}

impl Candidate {
    /// Buffer `o`'s lowest feasible offset once the candidate is placed.
    fn reach(&self, inst: &Instance, o: usize, min_off: &[u64]) -> u64 {
        if inst.lo[o] < self.bhi && self.blo < inst.hi[o] {
            min_off[o].max(self.raised)
        } else {
            min_off[o]
        }
    }
}

/// One dive's state.
struct Dive<'a> {
    inst: &'a Instance,
    setup: &'a DiveSetup,
    cap: u64,
    /// Without a capacity (`cap == u64::MAX`) nothing can be rejected: a plain skyline dive.
    infer: bool,
    t_end: u32,
    live: LiveIndex,
    /// The same with time reversed (slot t becomes `slots - 1 - t`), to find buffers that end
    /// before a given slot.
    live_rev: LiveIndex,
    floor: Vec<u64>,
    total: Vec<u64>,
    total_tree: TotalTree,
    wit: Witnesses,
    /// This dive's copy of the section lists, compacted as buffers are placed: `len[s]`
    /// entries from `start[s]`, `dead[s]` of them placed.
    lists: Option<(Vec<u32>, Vec<u32>)>,
    len: Vec<usize>,
    dead: Vec<usize>,
    near: Vec<u32>,
    min_off: Vec<u64>,
    placed: Vec<bool>,
    parked: Vec<bool>,
    offsets: Vec<u64>,
    /// Candidates by (lowest feasible offset, rank), and buffers by lowest reachable top; both
    /// kept exact: every raise moves the entries.
    cand: ExactQueue,
    height: ExactQueue,
    stack: Vec<(usize, usize, usize)>,
    at_risk: Vec<u32>,
    lifted: Vec<(u32, u64, u32)>,
    rejected: Vec<(u64, u32, u32)>,
    mark: Vec<u64>,
    epoch: u64,
}

impl<'a> Dive<'a> {
    fn new(inst: &'a Instance, setup: &'a DiveSetup, cap: u64, rank: &[u32]) -> Dive<'a> {
        let n = inst.n;
        let (lo_of, hi_of, size) = (&inst.lo, &inst.hi, &inst.size);
        let nsec = setup.section_slot.len();
        let live = LiveIndex::new(lo_of, hi_of, &setup.members);
        let t_end = inst.slots as u32;
        let rev_lo: Vec<u32> = hi_of.iter().map(|&h| t_end - h).collect();
        let rev_hi: Vec<u32> = lo_of.iter().map(|&l| t_end - l).collect();
        let live_rev = LiveIndex::new(&rev_lo, &rev_hi, &setup.members);
        let total = setup.total.clone();
        let total_tree = TotalTree::new(&total);
        let infer = cap != u64::MAX;
        let wit = Witnesses::new(inst, setup);
        let lists = setup
            .lists
            .as_ref()
            .map(|l| (l.by_lo.clone(), l.by_hi.clone()));
        let len: Vec<usize> = setup.lists.as_ref().map_or(Vec::new(), |l| {
            (0..nsec).map(|s| l.start[s + 1] - l.start[s]).collect()
        });
        let dead = vec![0usize; len.len()];
        let mut cand = ExactQueue::new(rank.to_vec());
        let mut height = ExactQueue::new(if infer {
            (0..n as u32).collect()
        } else {
            Vec::new()
        });
        for &b in &setup.members {
            cand.insert(b as usize, 0);
            if infer {
                height.insert(b as usize, size[b as usize]);
            }
        }
        Dive {
            inst,
            setup,
            cap,
            infer,
            t_end,
            live,
            live_rev,
            floor: vec![0u64; nsec],
            total,
            total_tree,
            wit,
            lists,
            len,
            dead,
            near: Vec::new(),
            min_off: vec![0u64; n],
            placed: vec![false; n],
            parked: vec![false; n],
            offsets: vec![0u64; n],
            cand,
            height,
            stack: Vec::new(),
            at_risk: Vec::new(),
            lifted: Vec::new(),
            rejected: Vec::new(),
            mark: vec![0u64; nsec],
            epoch: 0,
        }
    }

    /// The next buffer to place: the lowest candidate (by offset, then rank) not below the
    /// last placement whose placement keeps every section within the capacity.
    fn choose(&mut self, last_off: u64, last_rank: u32, deadline: Option<Deadline>) -> Pick {
        let inst = self.inst;
        let size = &inst.size;
        // The lowest top an unplaced buffer could reach (dominance).
        let min_height = match self.height.peek() {
            Some((k, _, b)) => {
                debug_assert_eq!(k, self.min_off[b as usize] + size[b as usize]);
                k
            }
            None => NONE,
        };
        // Offsets only rise, so every section needs its unplaced total above `off`.
        let highest = self.cap.saturating_sub(self.total_tree.global_max());
        self.rejected.clear();
        let mut chosen = None;
        let mut attempts = 0u32;
        while let Some((key_off, r, b)) = self.cand.pop() {
            let bi = b as usize;
            if self.placed[bi] {
                continue;
            }
            attempts += 1;
            if attempts & 7 == 0 && deadline.is_some_and(Deadline::passed) {
                return Pick::Aborted;
            }
            debug_assert_eq!(self.min_off[bi], key_off, "keys are exact");
            let key = key_off;
            let off = key;
            if off >= min_height || off > highest {
                self.rejected.push((key, r, b));
                break;
            }
            if off < last_off || (off == last_off && r < last_rank) {
                // Below the current offset: it can only come back once something placed later
                // raises it. Park it until then.
                self.parked[bi] = true;
                continue;
            }
            if off + size[bi] > self.cap {
                self.rejected.push((key, r, b));
                continue;
            }
            if !self.infer || self.keeps_room(b, off) {
                chosen = Some((b, off, r));
                break;
            }
            self.rejected.push((key, r, b));
        }
        for &(k, _, b) in &self.rejected {
            self.cand.insert(b as usize, k);
        }
        match chosen {
            Some((b, off, r)) => Pick::Chosen(b, off, r),
            None => Pick::Failed,
        }
    }

    /// Whether placing `b` at `off` leaves every section whose witness it breaks room for its
    /// unplaced total; the floors to lift (and their new witnesses) are left in `lifted`.
    fn keeps_room(&mut self, b: u32, off: u64) -> bool {
        let inst = self.inst;
        let bi = b as usize;
        let top = off + inst.size[bi];
        let (blo, bhi) = (inst.lo[bi], inst.hi[bi]);
        let sec = |slot: u32| self.setup.first_section[slot as usize] as usize;
        let c = Candidate {
            b,
            blo,
            bhi,
            span_lo: sec(blo),
            span_hi: sec(bhi),
            top,
            raised: align_up(top, inst.align),
        };
        self.collect_at_risk(&c);
        self.lifted.clear();
        let at_risk = std::mem::take(&mut self.at_risk);
        let mut ok = true;
        for &s in &at_risk {
            if !self.section_keeps_room(&c, s as usize) {
                ok = false;
                break;
            }
        }
        self.at_risk = at_risk;
        ok
    }

    /// Sections whose witness placing `c` breaks: those of `b` itself and of the buffers it
    /// raises.
    fn collect_at_risk(&mut self, c: &Candidate) {
        self.at_risk.clear();
        self.epoch += 1;
        self.near.clear();
        let (min_off, near) = (&self.min_off, &mut self.near);
        self.wit
            .index
            .for_each_overlapping(c.blo, c.bhi, &mut self.stack, |o| {
                if o != c.b && min_off[o as usize] < c.raised {
                    near.push(o);
                }
                true
            });
        self.wit
            .collect(c.b, &mut self.mark, self.epoch, &mut self.at_risk);
        for &o in &self.near {
            self.wit
                .collect(o, &mut self.mark, self.epoch, &mut self.at_risk);
        }
    }

    /// Whether section `s` keeps room for its unplaced total once `c` is placed: its witness
    /// still holds, a new one is found, or its floor lifts (recorded in `lifted`) within the
    /// capacity.
    fn section_keeps_room(&mut self, c: &Candidate, s: usize) -> bool {
        let inst = self.inst;
        let bi = c.b as usize;
        let in_span = c.span_lo <= s && s < c.span_hi;
        let (f, t) = if in_span {
            (self.floor[s].max(c.top), self.total[s] - inst.size[bi])
        } else {
            (self.floor[s], self.total[s])
        };
        let w = self.wit.of[s] as usize;
        if w != bi && c.reach(inst, w, &self.min_off) <= f {
            return true;
        }
        let (low, lowest, arg) = self.lowest_in_section(c, s, w, f);
        if low != NO_BUFFER {
            // A witness after the placement; also one now (keep it whatever happens)
            // if its offset is already within the current floor.
            if self.min_off[low as usize] <= self.floor[s] {
                self.wit.set(s, low);
            } else {
                self.lifted.push((s as u32, 0, low));
            }
            return true;
        }
        if lowest == NONE {
            return true; // nothing left to place there
        }
        if lowest + t > self.cap {
            return false;
        }
        self.lifted.push((s as u32, lowest, arg));
        true
    }

    /// Searches section `s` (witness `w`, floor `f` after placing `c`) for a new witness:
    /// `(low, lowest, arg)`, `low` an unplaced buffer that could sit within the floor
    /// ([`NO_BUFFER`] if none), else the lowest feasible offset there and its buffer.
    fn lowest_in_section(&mut self, c: &Candidate, s: usize, w: usize, f: u64) -> (u32, u64, u32) {
        let Dive {
            inst,
            setup,
            t_end,
            live,
            live_rev,
            lists,
            len,
            min_off,
            placed,
            stack,
            ..
        } = self;
        let (inst, t_end) = (*inst, *t_end);
        let (lo_of, hi_of) = (&inst.lo, &inst.hi);
        let (b, blo, bhi) = (c.b, c.blo, c.bhi);
        let slot = setup.section_slot[s];
        let mut lowest = NONE;
        let (mut low, mut arg) = (NO_BUFFER, NO_BUFFER);
        let mut visit = |o: u32| {
            if o == b {
                return true;
            }
            let m = c.reach(inst, o as usize, min_off);
            if m <= f {
                low = o;
                return false;
            }
            if m < lowest {
                lowest = m;
                arg = o;
            }
            true
        };
        if w == b as usize {
            // `b`'s own section: every buffer there meets `b`; look at all of them.
            if let (Some(l), Some((by_lo, _))) = (&setup.lists, &*lists) {
                for &o in by_lo[l.start[s]..l.start[s] + len[s]].iter().rev() {
                    if !placed[o as usize] && !visit(o) {
                        break;
                    }
                }
            } else {
                live.for_each_overlapping(slot, slot + 1, stack, visit);
            }
            return (low, lowest, arg);
        }
        // The witness meets `b` and rises to exactly `raised`, the least any buffer
        // meeting `b` can reach: only the buffers that miss `b` can do better: to the
        // right of `b`, those starting after it ends (latest start first); to the
        // left, those ending before it starts (earliest end first).
        if let (Some(l), Some((by_lo, by_hi))) = (&setup.lists, &*lists) {
            let range = l.start[s]..l.start[s] + len[s];
            // Walk from the end nearest the section; stop at the first buffer
            // that meets `b` (the lists are sorted, so all the rest do too).
            if s >= c.span_hi {
                for &o in by_lo[range].iter().rev() {
                    if lo_of[o as usize] < bhi {
                        break;
                    }
                    if !placed[o as usize] && !visit(o) {
                        break;
                    }
                }
            } else if s < c.span_lo {
                for &o in &by_hi[range] {
                    if hi_of[o as usize] > blo {
                        break;
                    }
                    if !placed[o as usize] && !visit(o) {
                        break;
                    }
                }
            }
        } else if s >= c.span_hi {
            live.for_each_overlapping_from(bhi, slot, slot + 1, stack, true, &mut visit);
        } else if s < c.span_lo {
            let r = t_end - 1 - slot;
            live_rev.for_each_overlapping_from(t_end - blo, r, r + 1, stack, true, &mut visit);
        }
        if low == NO_BUFFER && c.raised < lowest {
            lowest = c.raised;
            arg = w as u32;
        }
        (low, lowest, arg)
    }

    /// Places `b` at `off`: raises the buffers it meets, lowers the sections' unplaced totals
    /// and lifts their floors as [`Self::keeps_room`] found.
    fn place(&mut self, b: u32, off: u64) {
        let inst = self.inst;
        let size = &inst.size;
        let bi = b as usize;
        let top = off + size[bi];
        let raised = align_up(top, inst.align);
        self.placed[bi] = true;
        if self.infer {
            self.height.remove(bi);
        }
        self.offsets[bi] = off;
        self.live.remove(bi);
        self.live_rev.remove(bi);
        let Dive {
            live,
            stack,
            min_off,
            parked,
            cand,
            height,
            infer,
            ..
        } = self;
        live.for_each_overlapping(inst.lo[bi], inst.hi[bi], stack, |o| {
            let o = o as usize;
            if min_off[o] < raised {
                min_off[o] = raised;
                if parked[o] {
                    parked[o] = false;
                    cand.insert(o, raised);
                } else if cand.contains(o) {
                    cand.update(o, raised);
                }
                if *infer {
                    height.update(o, raised + size[o]);
                }
            }
            true
        });
        let sec = |slot: u32| self.setup.first_section[slot as usize] as usize;
        let (span_lo, span_hi) = (sec(inst.lo[bi]), sec(inst.hi[bi]));
        for s in span_lo..span_hi {
            self.floor[s] = self.floor[s].max(top);
            self.total[s] -= size[bi];
        }
        if self.infer {
            self.compact_lists(span_lo, span_hi);
        }
        self.total_tree.subtract(span_lo, span_hi, size[bi]);
        for &(s, v, w) in &self.lifted {
            let s = s as usize;
            self.floor[s] = self.floor[s].max(v);
            self.wit.set(s, w);
        }
        if self.infer {
            self.wit.index.remove(bi);
            self.wit.lists[bi] = Vec::new();
        }
    }

    /// Counts a placement in each section of `[span_lo, span_hi)` and drops the placed buffers
    /// from a section's lists once they are more than half of it.
    fn compact_lists(&mut self, span_lo: usize, span_hi: usize) {
        let (Some(l), Some((by_lo, by_hi))) = (&self.setup.lists, &mut self.lists) else {
            return;
        };
        let (placed, len, dead) = (&self.placed, &mut self.len, &mut self.dead);
        for s in span_lo..span_hi {
            dead[s] += 1;
            if 2 * dead[s] > len[s] {
                let (a, n) = (l.start[s], len[s]);
                let mut keep = 0;
                for i in 0..n {
                    if !placed[by_lo[a + i] as usize] {
                        by_lo[a + keep] = by_lo[a + i];
                        keep += 1;
                    }
                }
                let mut keep2 = 0;
                for i in 0..n {
                    if !placed[by_hi[a + i] as usize] {
                        by_hi[a + keep2] = by_hi[a + i];
                        keep2 += 1;
                    }
                }
                debug_assert_eq!(keep, keep2);
                len[s] = keep;
                dead[s] = 0;
            }
        }
    }
}
