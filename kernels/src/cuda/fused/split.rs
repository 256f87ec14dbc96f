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
//!
//! Either way, a column reduction's ways are last doubled while its partial kernel, as
//! generated, launches so few blocks that twice as many would still run one an SM at once
//! ([`filled`]): the partial sums go to the node's planned workspace as before (a fixed
//! partition of the rows, folded in a fixed order by the finish kernel: no atomics, the
//! same bits on every run).

use super::analysis::Analysis;
use super::layout::FILL;
use crate::cuda::kernel::Strategy;
use crate::fused::{split, staged, FusedKernel};

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
/// The blocks a kernel's generated text launches (`None` where it does not generate).
pub(crate) type Blocks<'a> = &'a dyn Fn(&FusedKernel) -> Option<usize>;

/// SMs of the GPU the partial kernels are sized for (an H100's and an H200's 132).
const SMS: usize = FILL / 2;
/// Terms a partial row keeps at least where a column reduction's ways are doubled to fill
/// the SMs ([`filled`]): a block of 256 threads along a row still gets two terms a thread.
const MIN_FILL_PARTIAL_TERMS: usize = 512;

/// `ways` doubled while the partial kernel `blocks(ways)` says it launches leaves at least
/// half the SMs without a block (twice as many blocks still fit one wave of one block an SM),
/// the axis still splits twice as many ways, and each partial row keeps at least
/// [`MIN_FILL_PARTIAL_TERMS`] of the `n` terms.
///
/// Why: a column reduction's partial kernel gives a block up to 1,024 threads (one block an
/// SM, by their registers), each folding its share of a partial row in order, and so takes
/// about as long as one block takes whatever the number of blocks up to the SMs'. resnet50's
/// channels-last batch-norm backward at 7x7x512 (12.9 MB) ran on 32 blocks in 28.1 µs and at
/// 14x14x256 (25.7 MB) on 64 in 28.9 µs, where its 28x28x128 kernel (51.4 MB, 128 blocks)
/// took 38.4 (docs/benchmarks.md, session 41's profile and session 42's bytes): the same
/// threads' work, a quarter and half of the SMs.
fn filled(
    k: &FusedKernel,
    axis: usize,
    ways: usize,
    n: usize,
    blocks: impl Fn(usize) -> Option<usize>,
) -> usize {
    let mut w = ways;
    while k.domain[axis].is_multiple_of(2 * w) && n / (2 * w) >= MIN_FILL_PARTIAL_TERMS {
        match blocks(w) {
            Some(b) if 2 * b <= SMS => w *= 2,
            _ => break,
        }
    }
    w
}

/// The reduce axis and the number of slices a column reduction is split into, or `None`
/// where its one kernel is kept: not the column strategy, rows short, blocks enough, or no
/// reduce axis it can be split along ([`split::splittable`]) a power of two of times. The
/// ways are then doubled while the partial kernel leaves half the SMs idle ([`filled`]).
///
/// `blocks_of` gives the blocks a kernel's generated text launches (the generator's, passed in
/// by its caller).
pub(crate) fn split_ways(k: &FusedKernel, blocks_of: Blocks) -> Option<(usize, usize)> {
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
    let partial_blocks = |w| blocks_of(&split::split(k, axis, w)?.partial);
    Some((axis, filled(k, axis, ways, a.n, partial_blocks)))
}

/// The reduce axis and the number of slices a reduction is split by stages into
/// ([`crate::fused::staged`]), or `None` where its one kernel is kept: it is split as a column
/// reduction ([`split_ways`]) instead, is elementwise, its rows are shorter than
/// `MIN_STAGED_TERMS` (`MIN_STAGED_COLUMN_TERMS` for the column strategy), or its blocks
/// fill the GPU. The axis is the outermost reduce axis (no live index reads it) that splits
/// at least `MIN_WAYS` ways, else the one that splits most; the ways, powers of two, grow
/// until the partial kernel's blocks fill the GPU or its rows would fold fewer than
/// `MIN_STAGED_PARTIAL_TERMS` terms; for the column strategy, then doubled while the first
/// stage's partial kernel leaves half the SMs idle ([`filled`]).
pub(crate) fn staged_ways(k: &FusedKernel, blocks_of: Blocks) -> Option<(usize, usize)> {
    k.check().ok()?;
    if split_ways(k, blocks_of).is_some() {
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
    let (axis, ways) = match splits.iter().find(|&&(_, w)| w >= MIN_WAYS) {
        Some(&s) => s,
        None => splits
            .iter()
            .copied()
            .max_by_key(|&(d, w)| (w, std::cmp::Reverse(d)))?,
    };
    if a.strategy != Strategy::Columns {
        return Some((axis, ways));
    }
    let partial_blocks = |w| blocks_of(&staged::staged(k, axis, w)?.passes.first()?.kernel);
    Some((axis, filled(k, axis, ways, a.n, partial_blocks)))
}
