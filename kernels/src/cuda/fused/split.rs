//! When a column reduction runs as two kernels ([`crate::fused::split`]): where its one
//! kernel leaves the GPU idle.
//!
//! A column reduction gets a block per 8 to 32 of its rows; GPT-2's bias and LayerNorm-gain
//! gradients (768 rows of 8,192 tokens) get 48, for an H100's 132 SMs, and its bf16 gain
//! gradient, which recomputes the normalized input at every term, took 45.7 µs on them
//! (docs/benchmarks.md, session 10). Split along its longest reduce axis, the partial kernel
//! has `ways` times the rows and fills the GPU; the finish kernel folds `ways` partials a row.
//!
//! A reduction whose full outputs read its reductions (batch norm over NCHW: reduce axes
//! `[0, 2, 3]`, a block a channel) is split by stages instead ([`crate::fused::staged`]),
//! by the same rule: fewer blocks than fill the GPU, long rows ([`staged_ways`]).

use super::analysis::Analysis;
use super::layout::FILL;
use crate::cuda::kernel::Strategy;
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
/// Rows a stage's partial kernel should have at least where the one kernel is of the row
/// strategy (a block a row): four blocks an SM of an H100, twice over.
const STAGED_ROWS: usize = 4 * FILL;
/// Terms each row of a stage's partial kernel folds at least: its blocks (up to 1024 threads)
/// get two terms a thread or more.
const MIN_STAGED_PARTIAL_TERMS: usize = 2048;
/// Reductions shorter than this are not split by stages: the chain adds a pass over the
/// inputs and two launches a stage, worth it only where one block walks a long row.
const MIN_STAGED_TERMS: usize = 16384;
/// The same bound for a column reduction (channels-last batch norm), whose one kernel gives
/// a block 8 to 32 channels and so leaves most SMs idle where channels are few: its passes
/// read every element from memory again all the same (a thread's share is too long for the
/// register cache), so splitting costs only launches. Measured on an H200 (docs/benchmarks.md,
/// session 38): resnet50's 7x7 data-gradient kernels (6,272 terms a channel, 2,048 channels
/// in 64 blocks of [32, 32]) took 302 to 605 µs for 39 to 141 MB, under 0.5 TB/s, and are
/// split now; its partial rows keep at least `MIN_STAGED_PARTIAL_TERMS` (split to 784, its
/// 28x28 kernels of 128 channels took 38.1 µs where 3,136 took 33.1).
const MIN_STAGED_COLUMN_TERMS: usize = 4096;

/// The reduce axis and the number of slices a column reduction is split into, or `None`
/// where its one kernel is kept: not the column strategy, rows short, blocks enough, or no
/// reduce axis it can be split along ([`split::splittable`]) a power of two of times.
pub(crate) fn split_ways(k: &FusedKernel) -> Option<(usize, usize)> {
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

/// The reduce axis and the number of slices a reduction is split by stages into
/// ([`crate::fused::staged`]), or `None` where its one kernel is kept: it is split as a column
/// reduction ([`split_ways`]) instead, is elementwise, its rows are shorter than
/// `MIN_STAGED_TERMS` (`MIN_STAGED_COLUMN_TERMS` for the column strategy), or its blocks
/// fill the GPU. The axis is the outermost reduce axis (no live index reads it) that splits
/// at least `MIN_WAYS` ways, else the one that splits most; the ways, powers of two, grow
/// until the partial kernel's blocks fill the GPU or its rows would fold fewer than
/// `MIN_STAGED_PARTIAL_TERMS` terms.
pub(crate) fn staged_ways(k: &FusedKernel) -> Option<(usize, usize)> {
    k.check().ok()?;
    if split_ways(k).is_some() {
        return None;
    }
    let a = Analysis::new(k);
    let min_terms = match a.strategy {
        Strategy::Columns => MIN_STAGED_COLUMN_TERMS,
        _ => MIN_STAGED_TERMS,
    };
    if a.n < min_terms || a.rows == 0 {
        return None;
    }
    let (blocks, target) = match a.strategy {
        Strategy::Rows => (a.rows, STAGED_ROWS),
        Strategy::Columns => (a.rows.div_ceil(a.column_block(1).0 as usize), SPLIT_ROWS),
        Strategy::Elementwise => return None,
    };
    if blocks >= FILL {
        return None;
    }
    let ways_of = |d: usize| {
        let mut w = 1;
        while w * a.rows < target
            && k.domain[d].is_multiple_of(2 * w)
            && a.n / (2 * w) >= MIN_STAGED_PARTIAL_TERMS
        {
            w *= 2;
        }
        (w >= 2).then_some((d, w))
    };
    let mut axes: Vec<usize> = (k.reduce_axes.iter().copied())
        .filter(|&d| !a.pinned[d])
        .collect();
    axes.sort_unstable();
    let splits: Vec<(usize, usize)> = axes.into_iter().filter_map(ways_of).collect();
    match splits.iter().find(|&&(_, w)| w >= MIN_WAYS) {
        Some(&s) => Some(s),
        None => splits
            .iter()
            .copied()
            .max_by_key(|&(d, w)| (w, std::cmp::Reverse(d))),
    }
}
