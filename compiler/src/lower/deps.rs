//! Which device operations of a step must wait for which: the step as a dependency graph
//! rather than a sequence, so that the CUDA graph runs independent work side by side.
//!
//! A step's operations are lowered in schedule order, and the memory plan reuses bytes along
//! that order: a buffer may take bytes that an earlier, dead buffer held. So operation `j` must
//! wait for an earlier `i` exactly when they touch a common byte and one of them writes it:
//! `j` reads what `i` wrote (read after write), `j` overwrites what `i` still had to read
//! (write after read), or both write it (write after write; a matmul's workspace is written by
//! the matmul, so two matmuls sharing workspace bytes run one after the other). Two operations
//! that only read the same bytes do not wait for each other.
//!
//! Nothing else orders the operations: with these edges, any execution that respects them
//! computes what the schedule order computes, bit for bit, since each operation sees the same
//! bytes in its inputs and no one else's writes land in its outputs while it runs. A bias
//! gradient's column sum, the small optimizer updates and the next layer's matmul, which the
//! schedule put one after another, now overlap where the GPU has room.
//!
//! [`dependencies`] keeps only the edges no other path implies (a transitive reduction), so
//! the graph is small; [`check`] verifies that every conflicting pair is ordered by some path.

use crate::plan::Location;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::collections::BTreeMap;

/// The bytes one device operation reads and writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Touch {
    pub reads: SmallVec<[Location; 6]>,
    pub writes: SmallVec<[Location; 2]>,
}

impl Touch {
    /// The bytes the operation must move: each distinct location it reads once, and each
    /// distinct location it writes once (a location read and written counts twice).
    pub fn bytes(&self) -> usize {
        let distinct = |ls: &[Location]| -> usize {
            let mut seen: SmallVec<[Location; 8]> = SmallVec::new();
            for l in ls {
                if !seen.contains(l) {
                    seen.push(*l);
                }
            }
            seen.iter().map(|l| l.bytes).sum()
        };
        distinct(&self.reads) + distinct(&self.writes)
    }

    /// Whether `self` and a later `later` must run in this order: they share a byte that one
    /// of them writes.
    pub fn conflicts(&self, later: &Touch) -> bool {
        let any =
            |a: &[Location], b: &[Location]| a.iter().any(|x| b.iter().any(|y| overlap(*x, *y)));
        any(&self.writes, &later.reads)
            || any(&self.writes, &later.writes)
            || any(&self.reads, &later.writes)
    }
}

fn overlap(a: Location, b: Location) -> bool {
    a.bytes > 0 && b.bytes > 0 && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes
}

/// For each operation, the earlier operations it must wait for directly: every conflicting
/// earlier operation is one of these or reached through them, and none of these is reached
/// through another.
///
/// Linear in the step's length for the programs steps make: the conflicting earlier
/// operations are found through `Accesses` (the last writer of each byte and its readers
/// since: every other conflict is ordered through them), and an edge is dropped when a later
/// kept one reaches it, by a walk that stops below the earliest candidate. A convolution run
/// a few images at a time is thousands of operations on one workspace; comparing every pair,
/// as this did before, took minutes and gigabytes for a ResNet at a large batch.
pub fn dependencies(touches: &[Touch]) -> Vec<SmallVec<[usize; 4]>> {
    let mut accesses = Accesses::default();
    let mut walk = Walk::new(touches.len());
    let mut deps: Vec<SmallVec<[usize; 4]>> = Vec::with_capacity(touches.len());
    for (j, t) in touches.iter().enumerate() {
        let mut candidates = accesses.conflicts(t);
        // Latest first: an earlier conflict reached through a later one needs no edge.
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.dedup();
        let floor = candidates.last().copied().unwrap_or(0);
        walk.start();
        let mut direct: SmallVec<[usize; 4]> = SmallVec::new();
        for &i in &candidates {
            if walk.seen(i) {
                continue;
            }
            direct.push(i);
            walk.visit_from(i, floor, &deps);
        }
        direct.reverse();
        deps.push(direct);
        accesses.record(j, t);
    }
    deps
}

/// Which operations last touched each byte, as a step's operations are taken in order: for
/// every run of bytes, the last operation that wrote it and those that read it since. An
/// operation that reads a run must wait for its writer; one that writes it must wait for the
/// writer and the readers. Every other earlier conflict is ordered through these: the writer
/// waited for the writers and readers before it, and a reader for the writer before it.
#[derive(Default)]
struct Accesses {
    /// Disjoint runs of bytes by their first byte: (one past the last byte, the state).
    runs: BTreeMap<usize, (usize, Run)>,
}

#[derive(Clone, Default)]
struct Run {
    writer: Option<usize>,
    readers: SmallVec<[usize; 2]>,
}

impl Accesses {
    /// The earlier operations `t` conflicts with directly (with repeats).
    fn conflicts(&self, t: &Touch) -> Vec<usize> {
        let mut out = Vec::new();
        for l in t.reads.iter().filter(|l| l.bytes > 0) {
            for (_, run) in self.overlapping(*l) {
                out.extend(run.writer);
            }
        }
        for l in t.writes.iter().filter(|l| l.bytes > 0) {
            for (_, run) in self.overlapping(*l) {
                out.extend(run.writer);
                out.extend_from_slice(&run.readers);
            }
        }
        out
    }

    /// The runs sharing a byte with `l`, by first byte.
    fn overlapping(&self, l: Location) -> impl Iterator<Item = (usize, &Run)> {
        let end = l.offset + l.bytes;
        let before = self
            .runs
            .range(..l.offset)
            .next_back()
            .filter(|(_, (e, _))| *e > l.offset);
        before
            .into_iter()
            .chain(self.runs.range(l.offset..end))
            .map(|(&s, (_, run))| (s, run))
    }

    /// Operation `j`'s touches taken: its reads first, then its writes (which leave only `j`
    /// as the bytes' last toucher: its own read is ordered before its write within it).
    fn record(&mut self, j: usize, t: &Touch) {
        for l in t.reads.iter().filter(|l| l.bytes > 0) {
            self.split(l.offset);
            self.split(l.offset + l.bytes);
            let end = l.offset + l.bytes;
            // Bytes no run covers yet become runs read by `j` alone.
            let mut at = l.offset;
            let mut gaps = Vec::new();
            for (&s, (e, run)) in self.runs.range_mut(l.offset..end) {
                if s > at {
                    gaps.push((at, s));
                }
                run.readers.push(j);
                at = *e;
            }
            if at < end {
                gaps.push((at, end));
            }
            for (s, e) in gaps {
                let mut run = Run::default();
                run.readers.push(j);
                self.runs.insert(s, (e, run));
            }
        }
        for l in t.writes.iter().filter(|l| l.bytes > 0) {
            self.split(l.offset);
            self.split(l.offset + l.bytes);
            let end = l.offset + l.bytes;
            let inside: Vec<usize> = self.runs.range(l.offset..end).map(|(&s, _)| s).collect();
            for s in inside {
                self.runs.remove(&s);
            }
            let run = Run {
                writer: Some(j),
                readers: SmallVec::new(),
            };
            self.runs.insert(l.offset, (end, run));
        }
    }

    /// Makes `at` the first byte of a run if a run covers it.
    fn split(&mut self, at: usize) {
        let Some((&s, (e, run))) = self.runs.range(..at).next_back() else {
            return;
        };
        if *e > at {
            let (e, run) = (*e, run.clone());
            self.runs.insert(s, (at, run.clone()));
            self.runs.insert(at, (e, run));
        }
    }
}

/// A walk backwards over dependency edges from some operations, which marks what they reach
/// and stops below a floor (edges only point back, so nothing below it reaches above it).
struct Walk {
    mark: Vec<u32>,
    round: u32,
    stack: Vec<usize>,
}

impl Walk {
    fn new(n: usize) -> Walk {
        Walk {
            mark: vec![0; n],
            round: 0,
            stack: Vec::new(),
        }
    }

    /// Forgets every mark.
    fn start(&mut self) {
        self.round += 1;
        if self.round == u32::MAX {
            self.mark.fill(0);
            self.round = 1;
        }
    }

    fn seen(&self, i: usize) -> bool {
        self.mark[i] == self.round
    }

    /// Marks `from` and everything at or above `floor` that it reaches through `deps`.
    fn visit_from(&mut self, from: usize, floor: usize, deps: &[SmallVec<[usize; 4]>]) {
        self.stack.push(from);
        while let Some(i) = self.stack.pop() {
            if i < floor || self.mark[i] == self.round {
                continue;
            }
            self.mark[i] = self.round;
            self.stack
                .extend(deps[i].iter().copied().filter(|&k| k >= floor));
        }
    }
}

/// Programs up to this many operations are checked pair by pair ([`check`]).
const CHECK_EVERY_PAIR_UP_TO: usize = 4096;

/// Checks `deps` against `touches`: every edge points to an earlier operation, and for every
/// pair of conflicting operations the later one reaches the earlier through edges. The error
/// names the first pair left unordered.
///
/// Up to `CHECK_EVERY_PAIR_UP_TO` (4,096) operations (every reference model's step) it compares
/// every pair and shares no code with [`dependencies`]. Longer programs would take minutes
/// that way; there the pairs are those `Accesses` finds (each conflict is ordered through
/// them, and a test holds the two checks to the same verdicts), and reachability is walked
/// over the edges given, so a missing or wrong edge is still found.
pub fn check(touches: &[Touch], deps: &[SmallVec<[usize; 4]>]) -> Result<(), String> {
    if deps.len() != touches.len() {
        return Err(format!(
            "{} dependency lists for {} operations",
            deps.len(),
            touches.len()
        ));
    }
    for (j, d) in deps.iter().enumerate() {
        if let Some(&i) = d.iter().find(|&&i| i >= j) {
            return Err(format!(
                "operation {j} waits for {i}, which does not come before it"
            ));
        }
    }
    if touches.len() <= CHECK_EVERY_PAIR_UP_TO {
        check_every_pair(touches, deps)
    } else {
        check_through_accesses(touches, deps)
    }
}

fn unordered(i: usize, j: usize) -> String {
    format!(
        "operations {i} and {j} touch a common byte that one writes, but {j} does not wait for {i}"
    )
}

/// [`check`] by comparing every pair of operations.
fn check_every_pair(touches: &[Touch], deps: &[SmallVec<[usize; 4]>]) -> Result<(), String> {
    for j in 0..touches.len() {
        // Everything j reaches, by a walk over the edges.
        let mut seen = vec![false; j];
        let mut stack: Vec<usize> = deps[j].to_vec();
        while let Some(i) = stack.pop() {
            if !std::mem::replace(&mut seen[i], true) {
                stack.extend_from_slice(&deps[i]);
            }
        }
        for i in 0..j {
            let (a, b) = (&touches[i], &touches[j]);
            let shared = |x: &[Location], y: &[Location]| {
                x.iter().any(|p| {
                    y.iter().any(|q| {
                        p.bytes > 0
                            && q.bytes > 0
                            && p.offset.max(q.offset) < (p.offset + p.bytes).min(q.offset + q.bytes)
                    })
                })
            };
            let conflict = shared(&a.writes, &b.reads)
                || shared(&a.writes, &b.writes)
                || shared(&a.reads, &b.writes);
            if conflict && !seen[i] {
                return Err(unordered(i, j));
            }
        }
    }
    Ok(())
}

/// [`check`] through the conflicts [`Accesses`] finds, reachability walked over `deps`.
fn check_through_accesses(touches: &[Touch], deps: &[SmallVec<[usize; 4]>]) -> Result<(), String> {
    let mut accesses = Accesses::default();
    let mut walk = Walk::new(touches.len());
    for (j, t) in touches.iter().enumerate() {
        let mut needed = accesses.conflicts(t);
        needed.sort_unstable();
        needed.dedup();
        if let Some(&floor) = needed.first() {
            walk.start();
            for &i in &deps[j] {
                walk.visit_from(i, floor, deps);
            }
            if let Some(&i) = needed.iter().find(|&&i| !walk.seen(i)) {
                return Err(unordered(i, j));
            }
        }
        accesses.record(j, t);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(offset: usize, bytes: usize) -> Location {
        Location { offset, bytes }
    }

    fn touch(reads: &[(usize, usize)], writes: &[(usize, usize)]) -> Touch {
        Touch {
            reads: reads.iter().map(|&(o, b)| at(o, b)).collect(),
            writes: writes.iter().map(|&(o, b)| at(o, b)).collect(),
        }
    }

    #[test]
    fn two_readers_of_one_buffer_do_not_wait_for_each_other() {
        let t = [
            touch(&[], &[(0, 100)]),
            touch(&[(0, 100)], &[(256, 100)]),
            touch(&[(0, 100)], &[(512, 100)]),
        ];
        let d = dependencies(&t);
        assert_eq!(d[1].as_slice(), &[0]);
        assert_eq!(d[2].as_slice(), &[0]);
        check(&t, &d).unwrap();
    }

    #[test]
    fn a_write_into_reused_bytes_waits_for_their_last_reader() {
        // 0 writes A; 1 reads A into B; 2 reuses A's bytes for C (write after read).
        let t = [
            touch(&[], &[(0, 100)]),
            touch(&[(0, 100)], &[(256, 100)]),
            touch(&[(1024, 8)], &[(64, 100)]),
        ];
        let d = dependencies(&t);
        assert_eq!(d[2].as_slice(), &[1], "0 is reached through 1");
        check(&t, &d).unwrap();
    }

    #[test]
    fn a_chain_keeps_only_its_links() {
        // Each reads the previous one's output and also the first's: the edge to the first
        // is implied by the chain.
        let t = [
            touch(&[], &[(0, 10)]),
            touch(&[(0, 10)], &[(100, 10)]),
            touch(&[(0, 10), (100, 10)], &[(200, 10)]),
            touch(&[(0, 10), (200, 10)], &[(300, 10)]),
        ];
        let d = dependencies(&t);
        assert_eq!(d[2].as_slice(), &[1]);
        assert_eq!(d[3].as_slice(), &[2]);
        check(&t, &d).unwrap();
    }

    #[test]
    fn the_checker_finds_a_missing_edge() {
        let t = [touch(&[], &[(0, 10)]), touch(&[(5, 1)], &[(100, 10)])];
        let err = check(&t, &[SmallVec::new(), SmallVec::new()]).unwrap_err();
        assert!(err.contains("operations 0 and 1"), "{err}");
        // Adjacent ranges share no byte: no edge is needed.
        let t = [touch(&[], &[(0, 10)]), touch(&[(10, 1)], &[(100, 10)])];
        check(&t, &dependencies(&t)).unwrap();
        assert!(dependencies(&t)[1].is_empty());
    }

    fn arb_touches() -> impl Strategy<Value = Vec<Touch>> {
        let span = (0usize..64, 0usize..12).prop_map(|(o, b)| at(o, b));
        let one = (
            proptest::collection::vec(span.clone(), 0..4),
            proptest::collection::vec(span, 0..3),
        )
            .prop_map(|(r, w)| Touch {
                reads: r.into_iter().collect(),
                writes: w.into_iter().collect(),
            });
        proptest::collection::vec(one, 0..40)
    }

    #[test]
    fn a_long_chunked_program_gets_its_chain_of_edges_and_passes_the_check() {
        // A convolution a few images at a time: each chunk's unfold writes the shared column
        // buffer, its product reads it and writes its images' rows of the output. 60,000
        // operations: comparing every pair would take minutes and gigabytes.
        let chunks = 30_000;
        let mut t = Vec::with_capacity(2 * chunks);
        for k in 0..chunks {
            t.push(touch(&[(1 << 30, 4096)], &[(0, 4096)]));
            t.push(touch(
                &[(0, 4096), (1 << 29, 64)],
                &[((1 << 31) + 64 * k, 64)],
            ));
        }
        let d = dependencies(&t);
        for k in 1..chunks {
            // The unfold waits for the previous product only (which waited for its unfold).
            assert_eq!(d[2 * k].as_slice(), &[2 * k - 1]);
            assert_eq!(d[2 * k + 1].as_slice(), &[2 * k]);
        }
        check(&t, &d).unwrap();
        let mut broken = d.clone();
        broken[2 * chunks - 2].clear();
        let err = check(&t, &broken).unwrap_err();
        // The last unfold overwrites the column buffer the previous unfold wrote.
        let pair = format!("operations {} and {}", 2 * chunks - 4, 2 * chunks - 2);
        assert!(err.contains(&pair), "{err}");
    }

    fn arb_deps(n: usize) -> impl Strategy<Value = Vec<SmallVec<[usize; 4]>>> {
        proptest::collection::vec(proptest::collection::vec(0usize..64, 0..4), n).prop_map(|d| {
            d.into_iter()
                .enumerate()
                .map(|(j, v)| v.into_iter().filter(|&i| i < j).collect())
                .collect()
        })
    }

    proptest! {
        #[test]
        fn every_conflicting_pair_is_ordered_and_no_edge_is_implied_by_others(t in arb_touches()) {
            let d = dependencies(&t);
            prop_assert!(check(&t, &d).is_ok(), "{:?}", check(&t, &d));
            // Minimal: dropping any edge leaves some conflict unordered, or the edge's
            // target was reachable another way (which the reduction rules out).
            for j in 0..d.len() {
                for k in 0..d[j].len() {
                    let mut fewer = d.clone();
                    fewer[j].remove(k);
                    prop_assert!(check(&t, &fewer).is_err(), "edge {} -> {j} is implied", d[j][k]);
                }
            }
        }

        #[test]
        fn the_check_through_accesses_gives_the_pairwise_verdict(
            (t, other) in arb_touches().prop_flat_map(|t| { let n = t.len(); (Just(t), arb_deps(n)) })
        ) {
            let d = dependencies(&t);
            let verdicts = |d: &[SmallVec<[usize; 4]>]| {
                (check_every_pair(&t, d).is_ok(), check_through_accesses(&t, d).is_ok())
            };
            let (a, b) = verdicts(&d);
            prop_assert!(a && b);
            for j in 0..d.len() {
                for k in 0..d[j].len() {
                    let mut fewer = d.clone();
                    fewer[j].remove(k);
                    let (a, b) = verdicts(&fewer);
                    prop_assert_eq!(a, b, "without edge {} -> {}", d[j][k], j);
                }
            }
            let (a, b) = verdicts(&other);
            prop_assert_eq!(a, b, "random edges {:?}", other);
        }
    }
}
