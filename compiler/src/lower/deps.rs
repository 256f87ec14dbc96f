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
//! the graph is small; [`check`] verifies, independently, that every conflicting pair is
//! ordered by some path.

use crate::plan::Location;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// The bytes one device operation reads and writes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Touch {
    pub reads: SmallVec<[Location; 6]>,
    pub writes: SmallVec<[Location; 2]>,
}

impl Touch {
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
pub fn dependencies(touches: &[Touch]) -> Vec<SmallVec<[usize; 4]>> {
    let n = touches.len();
    let words = n.div_ceil(64);
    // reach[j]: the operations j waits for, directly or not.
    let mut reach: Vec<Vec<u64>> = Vec::with_capacity(n);
    let mut deps = Vec::with_capacity(n);
    for j in 0..n {
        let mut covered = vec![0u64; words];
        let mut direct: SmallVec<[usize; 4]> = SmallVec::new();
        // Latest first: an earlier conflict reached through a later one needs no edge.
        for i in (0..j).rev() {
            if covered[i / 64] >> (i % 64) & 1 == 1 || !touches[i].conflicts(&touches[j]) {
                continue;
            }
            direct.push(i);
            covered[i / 64] |= 1 << (i % 64);
            for (c, r) in covered.iter_mut().zip(&reach[i]) {
                *c |= r;
            }
        }
        direct.reverse();
        reach.push(covered);
        deps.push(direct);
    }
    deps
}

/// Checks `deps` against `touches` without sharing code with [`dependencies`]: every edge
/// points to an earlier operation, and for every pair of conflicting operations the later one
/// reaches the earlier through edges. The error names the first pair left unordered.
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
                return Err(format!(
                    "operations {i} and {j} touch a common byte that one writes, but {j} does \
                     not wait for {i}"
                ));
            }
        }
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
    }
}
