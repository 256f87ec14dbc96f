//! When a column reduction runs as two kernels ([`crate::fused::split`]): where its one
//! kernel leaves the GPU idle.
//!
//! A column reduction gets a block per 8 to 32 of its rows; GPT-2's bias and LayerNorm-gain
//! gradients (768 rows of 8,192 tokens) get 48, for an H100's 132 SMs, and its bf16 gain
//! gradient, which recomputes the normalized input at every term, took 45.7 µs on them
//! (docs/benchmarks.md, session 10). Split along its longest reduce axis, the partial kernel
//! has `ways` times the rows and fills the GPU; the finish kernel folds `ways` partials a row.

use super::layout::FILL;
use super::Analysis;
use crate::cuda::Strategy;
use crate::fused::{split, FusedKernel};

/// Rows the partial kernel should have at least: four blocks of 32 rows an SM, twice over.
const SPLIT_ROWS: usize = 32 * 2 * FILL;
/// Terms each partial folds at least: fewer, and the finish kernel's share grows while the
/// partial kernel's blocks get too little work to hide their latency.
const MIN_PARTIAL_TERMS: usize = 128;
/// An outer reduce axis split this many ways is enough: splitting an inner one instead would
/// leave the reduce axes apart (GPT-2's `[8, 1024, 768]` bias gradients in its bf16 step on an
/// H100, session 10: split along the 1024 tokens, the partial kernel took 16.5 µs, more than
/// the whole kernel's 14.7; split along the batch axis, 9.9 µs).
const MIN_WAYS: usize = 8;
/// Reductions shorter than this are not split: their one kernel is already short.
const MIN_TERMS: usize = 2048;

/// The reduce axis and the number of slices a column reduction is split into, or `None`
/// where its one kernel is kept: not the column strategy, rows short, blocks enough, or no
/// reduce axis it can be split along ([`split::splittable`]) a power of two of times.
pub(in crate::cuda) fn split_ways(k: &FusedKernel) -> Option<(usize, usize)> {
    k.check().ok()?;
    let a = Analysis::new(k);
    if a.strategy != Strategy::Columns || a.n < MIN_TERMS || a.rows == 0 {
        return None;
    }
    let (x, _) = a.column_block(1);
    if a.rows.div_ceil(x as usize) >= FILL {
        return None;
    }
    // The outermost reduce axis that splits at least MIN_WAYS ways (its slices keep the inner
    // reduce axes whole, so they still merge into one index), else the one that splits most.
    let ways_of = |d: usize| {
        let (mut ways, mut w) = (None, 2);
        while k.domain[d].is_multiple_of(w) && a.n / w >= MIN_PARTIAL_TERMS {
            ways = Some(w);
            if w * a.rows >= SPLIT_ROWS {
                break;
            }
            w *= 2;
        }
        ways
    };
    let splits: Vec<(usize, usize)> = (k.reduce_axes.iter().copied())
        .filter(|&d| k.domain[d] >= 2 && split::splittable(k, d))
        .filter_map(|d| ways_of(d).map(|w| (d, w)))
        .collect();
    let (axis, ways) = match splits.iter().find(|&&(_, w)| w >= MIN_WAYS) {
        Some(&s) => s,
        None => *splits
            .iter()
            .max_by_key(|&&(d, w)| (w, std::cmp::Reverse(d)))?,
    };
    Some((axis, ways))
}
