//! The plan of a row or column kernel ([`Plan`]), which every loop over the row reads, and
//! the long rows' vectors it holds ([`RowVectors`]).

use super::layout::Shape;
use super::loads::{Addresses, Spaces};
use super::loops::Elements;
use super::passes::{OnlineSum, Passes};
use crate::cuda::guard::Guard;

/// What the stages before the loops over the row decided: every loop reads it, none changes
/// it (the one thing that changes from loop to loop, which cached loads are already in
/// registers, is passed beside it as `loaded`).
pub(super) struct Plan {
    pub(super) p: Passes,
    pub(super) shape: Shape,
    pub(super) sp: Spaces,
    pub(super) at: Addresses,
    pub(super) el: Elements,
    /// The loads kept in registers across the loops (`c{i}[u]`), the prefetched ones included.
    pub(super) cached: Vec<bool>,
    /// The output loop's loads read before its first store, by a loop of their own
    /// ([`Analysis::prefetched_loads`]).
    pub(super) prefetched: Vec<usize>,
    /// Each loop's guards (passes first, then the output loop).
    pub(super) guards: Vec<Vec<Option<Guard>>>,
    /// The second pass's sums, taken online in the first pass ([`Analysis::online_sums`]):
    /// rows too long for the register cache only, where the second pass would read the row
    /// from memory again, and only where a thread's share needs no blocked sum.
    pub(super) online: Vec<OnlineSum>,
    /// Long rows a vector at a time ([`Analysis::row_vectors`]), if they go so.
    pub(super) vectors: Option<RowVectors>,
}

/// Which loads and outputs of a long-row kernel go several elements at a time.
pub(super) struct RowVectors {
    /// Input `m` is read as vectors (where a loop reads it unguarded).
    pub(super) inputs: Vec<bool>,
    /// The full outputs are written as vectors.
    pub(super) outputs: bool,
    /// Elements a vector: 4, or 8 where every vector is of bf16 (16 bytes, as f32's 4).
    pub(super) width: usize,
}

/// One lane of a loop a vector at a time, as [`Analysis::loop_insts`] writes its body.
#[derive(Clone, Copy)]
pub(super) struct Lane<'a> {
    /// The lane: the vector's element `q`.
    pub(super) q: usize,
    /// Which inputs the loop reads as vectors.
    pub(super) vectors: &'a [bool],
    /// A condition whose value the lane knows, `(instruction, value)`: in the body of a vector
    /// whose every lane fails the loop's mask (one literal), its condition is the negation.
    pub(super) known: Option<(usize, bool)>,
}
