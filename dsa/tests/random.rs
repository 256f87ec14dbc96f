//! The offset solver on random interval sets, checked by a checker written here that shares no
//! code with the solver: every solution is a valid packing, never below LOAD, aligned, and the
//! same for the same input.

use ingot_dsa::{self as dsa, Buffer, Problem, SolveOptions};
use proptest::prelude::*;
use std::time::Duration;

/// Independent check: aligned offsets; buffers overlapping in time never overlap in bytes; the
/// reported peak is the highest end. Returns the LOAD of the problem.
fn check(p: &Problem, offsets: &[u64], peak: u64) -> Result<u64, String> {
    if offsets.len() != p.buffers.len() {
        return Err(format!(
            "{} offsets for {} buffers",
            offsets.len(),
            p.buffers.len()
        ));
    }
    let mut top = 0;
    for (i, (a, &oa)) in p.buffers.iter().zip(offsets).enumerate() {
        if oa % p.alignment != 0 {
            return Err(format!(
                "buffer {} at {oa} is not aligned to {}",
                a.id, p.alignment
            ));
        }
        top = top.max(oa + a.size);
        for (b, &ob) in p.buffers[i + 1..].iter().zip(&offsets[i + 1..]) {
            let in_time = a.lower < b.upper && b.lower < a.upper;
            let in_space = a.size > 0 && b.size > 0 && oa < ob + b.size && ob < oa + a.size;
            if in_time && in_space {
                return Err(format!(
                    "buffers {} and {} are live together and share bytes",
                    a.id, b.id
                ));
            }
        }
    }
    if top != peak {
        return Err(format!("reported peak {peak}, highest end {top}"));
    }
    let end = p.buffers.iter().map(|b| b.upper).max().unwrap_or(0);
    Ok((0..end)
        .map(|t| {
            p.buffers
                .iter()
                .filter(|b| b.lower <= t && t < b.upper)
                .map(|b| b.size)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0))
}

fn problem(raw: &[(u64, u64, u64)], alignment: u64) -> Problem {
    Problem {
        buffers: raw
            .iter()
            .enumerate()
            .map(|(i, &(lo, len, size))| Buffer {
                id: i as u64,
                lower: lo,
                upper: lo + len,
                size,
            })
            .collect(),
        alignment,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
    #[test]
    fn every_solution_is_a_valid_packing_never_below_load(
        raw in proptest::collection::vec((0u64..40, 1u64..15, 1u64..5000), 0..60),
        align_pow in 0u32..9,
    ) {
        let p = problem(&raw, 1 << align_pow);
        // The node budget, not the clock, ends the search, so the answer must repeat exactly.
        let opts = SolveOptions { time_limit: Duration::from_secs(30), node_limit: 5_000, ..SolveOptions::default() };
        let (s, stats) = dsa::solve(&p, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let load = check(&p, &s.offsets, s.peak).map_err(TestCaseError::fail)?;
        prop_assert!(s.peak >= load, "peak {} below LOAD {load}", s.peak);
        if p.alignment == 1 {
            prop_assert_eq!(stats.load, load);
        }
        let (again, _) = dsa::solve(&p, &opts).unwrap();
        prop_assert_eq!(again.offsets, s.offsets, "the same problem must give the same solution");
    }
}

#[test]
fn a_chain_of_buffers_costs_the_peak_not_the_sum() {
    // Ten buffers, each overlapping only its neighbours: two at a time are live.
    let raw: Vec<(u64, u64, u64)> = (0..10).map(|i| (i, 2, 100)).collect();
    let p = problem(&raw, 1);
    let (s, _) = dsa::solve(&p, &SolveOptions::default()).unwrap();
    assert_eq!(check(&p, &s.offsets, s.peak).unwrap(), 200);
    assert_eq!(s.peak, 200);
}

#[test]
fn a_capacity_below_load_is_an_error_not_a_panic() {
    let p = problem(&[(0, 2, 100), (1, 2, 100)], 1);
    let opts = SolveOptions {
        capacity: Some(150),
        time_limit: Duration::from_millis(100),
        ..SolveOptions::default()
    };
    let e = dsa::solve(&p, &opts).unwrap_err().to_string();
    assert!(e.contains("150") || e.contains("capacity"), "{e}");
}

#[test]
fn malformed_csv_names_the_line() {
    for (text, needle) in [
        ("id,lower,upper\n0,0,1\n", "size"),
        ("id,lower,upper,size\n0,0,1,x\n", "line 2"),
        ("id,lower,upper,size\n0,0,1,5\n0,1,2,5\n", "duplicate"),
        ("id,lower,upper,size\n0,3,1,5\n", "line 2"),
    ] {
        let e = dsa::read_csv(text).unwrap_err().to_string();
        assert!(e.contains(needle), "{text:?}: {e}");
    }
}
