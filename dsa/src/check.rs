//! An independent checker for offset assignments. It shares no code with the solver: it works on
//! the raw [`Problem`] (no time compression, no sections, no interval index), so a bug in the
//! solver's data structures cannot hide itself here.
//!
//! Method: sweep time in order; at each moment keep the buffers then live in a map keyed by
//! offset. Two buffers overlap in time exactly when one starts while the other is live, so it is
//! enough to check, as each buffer starts, that its byte range misses its two neighbours in the
//! map (the live set is disjoint by induction). `O(n log n)`.

use super::{DsaError, Problem, Solution};
use std::collections::BTreeMap;

/// Checks that `s` is a valid assignment for `p`: one offset per buffer, every offset a multiple
/// of the alignment, no two buffers live at the same time sharing a byte, and `s.peak` equal to
/// the largest `offset + size`. Returns a description of the first fault found.
pub fn validate(p: &Problem, s: &Solution) -> Result<(), DsaError> {
    let bad = |message: String| Err(DsaError::InvalidSolution { message });
    let n = p.buffers.len();
    if s.offsets.len() != n {
        return bad(format!("{} offsets for {} buffers", s.offsets.len(), n));
    }
    let align = p.alignment.max(1);
    let mut peak: u64 = 0;
    for (i, (b, &o)) in p.buffers.iter().zip(&s.offsets).enumerate() {
        if o % align != 0 {
            return bad(format!(
                "buffer {} (row {i}): offset {o} is not a multiple of {align}",
                b.id
            ));
        }
        let Some(top) = o.checked_add(b.size) else {
            return bad(format!(
                "buffer {} (row {i}): offset {o} + size {} overflows",
                b.id, b.size
            ));
        };
        peak = peak.max(top);
    }
    if peak != s.peak {
        return bad(format!(
            "reported peak {} but the largest offset+size is {peak}",
            s.peak
        ));
    }

    // Events: (time, kind, row) with ends (kind 0) before starts (kind 1) at equal times, because
    // lifetimes are half-open.
    let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(2 * n);
    for (i, b) in p.buffers.iter().enumerate() {
        if b.size == 0 {
            continue; // occupies no byte
        }
        events.push((b.lower, 1, i));
        events.push((b.upper, 0, i));
    }
    events.sort_unstable();
    // offset -> row, for the buffers live now (disjoint byte ranges, so offsets are unique).
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, kind, i) in events {
        let (o, size) = (s.offsets[i], p.buffers[i].size);
        if kind == 0 {
            live.remove(&o);
            continue;
        }
        if let Some((&po, &pj)) = live.range(..=o).next_back() {
            if po + p.buffers[pj].size > o {
                return bad(clash(p, s, i, pj));
            }
        }
        if let Some((&no, &nj)) = live.range(o..).next() {
            if no < o + size {
                return bad(clash(p, s, i, nj));
            }
        }
        live.insert(o, i);
    }
    Ok(())
}

fn clash(p: &Problem, s: &Solution, i: usize, j: usize) -> String {
    let d = |k: usize| {
        let b = &p.buffers[k];
        format!(
            "buffer {} (live [{}, {}), bytes [{}, {}))",
            b.id,
            b.lower,
            b.upper,
            s.offsets[k],
            s.offsets[k] + b.size
        )
    };
    format!("{} and {} are live together and share bytes", d(i), d(j))
}
