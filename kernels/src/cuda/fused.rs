//! CUDA C for a fused kernel (see the module docs of [`crate::cuda`] for the strategies and
//! [`crate::fused`] for what a kernel means).
//!
//! Generation runs in two steps: [`Analysis`] classifies the instructions (row-level or full,
//! live, reduction stage) and picks the strategy; the emitters then write one statement per
//! instruction, named `v{index}`, in body order within each place it is computed:
//! - row-level instructions of stage `s` once per row (in registers), after the reductions of
//!   stage `s` are complete (stage 0: before the first pass);
//! - in pass `p` (one per reduction stage), the full instructions that the stage-`p`
//!   reductions need, at every element of the row; then the reductions are combined across the
//!   threads that share the row, and every thread gets the result;
//! - in the final pass, the full instructions that the full outputs need, stored at each
//!   element by the thread that computed it (each thread reads and writes only its own
//!   elements there, after a barrier that ends every earlier pass over the row).
//!
//! The generator is a sequence of named stages, one module each, so that a reader can follow
//! one kernel from its description to its text:
//! - [`analysis`]: what the generator knows about a checked kernel, and the strategy;
//! - the elementwise strategy: [`elementwise`] (the grid-stride loop), [`vec4`] (four elements
//!   a thread) and [`tiled`] (transposes through shared-memory tiles);
//! - the row and column strategies, [`reduction`] strings these together: [`passes`] (which
//!   instructions each loop over the row computes), [`layout`] (threads per row, launch, which
//!   loads stay in registers), [`loops`] (the loop nest: rows, then a thread's elements of
//!   the row), [`guards`] (which loads are read only where a select needs them), [`loads`]
//!   (index spaces, row bases, addresses and the register cache), [`fold`] (combining the
//!   threads' partials), [`store`] (the outputs) and [`text`] (the finished text); a
//!   single-pass column reduction over contiguous channels goes several rows a thread
//!   instead ([`colvec`]: a vector load where the column strategy reads one element);
//! - shared by all: [`space`] (index spaces over some of the domain's axes) and [`expr`] (the
//!   right-hand side of one instruction).

use super::emit::finish;
use super::kernel::{CodegenError, CudaKernel, Strategy, Tuning};
use crate::fused::FusedKernel;
use analysis::Analysis;

mod analysis;
mod colvec;
mod elementwise;
mod expr;
mod fold;
mod guards;
mod layout;
mod loads;
mod loops;
mod passes;
mod plan;
mod reduction;
mod rowvec;
mod space;
mod split;
mod store;
mod text;
mod tiled;
mod vec4;

/// The blocks the first launch of `k`'s generated text takes (`None` where it does not
/// generate): what the split rules count ([`split::split_ways`]).
fn blocks_of(k: &FusedKernel) -> Option<usize> {
    generate(k).ok().map(|c| c.launch.grid[0] as usize)
}

/// The reduce axis and the ways a column reduction is split along ([`split::split_ways`]).
pub(super) fn split_ways(k: &FusedKernel) -> Option<(usize, usize)> {
    split::split_ways(k, &blocks_of)
}

/// The reduce axis and the ways a reduction is split by stages along
/// ([`split::staged_ways`]).
pub(super) fn staged_ways(k: &FusedKernel) -> Option<(usize, usize)> {
    split::staged_ways(k, &blocks_of)
}

/// The strategy [`generate`] picks for `k` (the runtime's kernel checks name and vary kernels
/// by it).
pub(super) fn strategy(k: &FusedKernel) -> Result<Strategy, CodegenError> {
    k.check()?;
    Ok(Analysis::new(k).strategy)
}

/// The CUDA C of `k`: the analysis picks the strategy, whose stages write the text.
pub(super) fn generate(k: &FusedKernel) -> Result<CudaKernel, CodegenError> {
    generate_tuned(k, Tuning::default())
}

/// [`generate`] with some of its choices overridden (see [`Tuning`]).
pub(super) fn generate_tuned(k: &FusedKernel, tuning: Tuning) -> Result<CudaKernel, CodegenError> {
    k.check()?;
    let mut a = Analysis::new(k);
    a.tuning = tuning;
    a.tuning.row_threads = tuning
        .row_threads
        .filter(|t| *t <= 1024 && (t.is_power_of_two() || t.is_multiple_of(32)));
    let (text, launch) = match a.strategy {
        Strategy::Elementwise => a.elementwise()?,
        Strategy::Rows | Strategy::Columns => a.reduction()?,
    };
    Ok(finish(text, launch))
}
