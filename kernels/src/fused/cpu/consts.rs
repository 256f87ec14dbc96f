//! The sizes and flag bits the interpreter's modules share, and the result type of everything
//! that runs a kernel: its scratch's alignment and lane counts, the layout of a reduction's
//! accumulator slot (which the compiled rows programs fold into too), and the flags of
//! instructions and axes in its tables.

use crate::cpu::reduce::LEVELS;
use crate::fused::check::KernelError;

pub(super) type R<T = ()> = Result<T, KernelError>;

/// Alignment of every region carved from the scratch.
pub(super) const ALIGN: usize = 64;
pub(super) const MAX_LANES: usize = 1024;
pub(super) const MIN_LANES: usize = 16;
/// Lanes × instructions to aim for.
pub(super) const LANE_BUDGET: usize = 8192;
/// Bytes per lane in a lane buffer (the widest dtype).
pub(super) const WORD: usize = 8;
/// Elements in a reduction's accumulator slot (rows case): eight partials, then the row's
/// cascade of block sums (its level 0 at [`RUNS`], which ends as the row's result; a max
/// folds its runs there).
pub(super) const SLOT: usize = 16;
pub(super) const RUNS: usize = 8;
const _: () = assert!(RUNS + LEVELS <= SLOT);

// Instruction flags.
pub(super) const ROW: usize = 1;
/// Evaluated per chunk in the passes (full; in the flat case, every instruction).
pub(super) const XFULL: usize = 2;
pub(super) const LIVE: usize = 4;
/// A row-level value that full instructions read lane by lane (rows case).
pub(super) const BCAST: usize = 8;
pub(super) const OUT_FULL: usize = 16;
/// Computed from constants only: evaluated once per run, on every lane.
pub(super) const CONST: usize = 32;
/// A full load that may be read in place (from the input's memory) instead of copied.
pub(super) const DIRECT: usize = 64;
/// `src` entry of a value that is in its lane buffer.
pub(super) const IN_BUFFER: usize = usize::MAX;
/// Padding between lane buffers, so that they do not all map to the same cache sets.
pub(super) const SKEW: usize = 192;

// Axis flags.
pub(super) const AX_RED: usize = 1;
pub(super) const AX_T: usize = 2;
