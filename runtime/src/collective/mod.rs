//! Collectives for data-parallel training: what a step compiled for `N` ranks
//! ([`ingot_compiler::autodiff::buckets`]) calls at each gradient bucket's all-reduce.
//!
//! A [`Collective`] is one rank's end of a group of `N`: every rank calls
//! [`Collective::all_reduce_sum`] with buffers of the same length, in the same order, and each
//! gets back the elementwise sum over the ranks (each rank's gradients are of its share of
//! the loss, so the sum is their mean); [`Collective::all_gather`] gives every rank
//! all the ranks' buffers, concatenated in rank order; [`Collective::reduce_scatter_sum`] gives
//! each rank its part of the sum. [`threads`] is the in-process implementation
//! (one thread per rank, summed in rank order, so every run and every rank gets the
//! same bits): it runs `N` ranks on one machine's CPU, which is how data parallelism is tested
//! without several GPUs.

pub mod launch;
pub mod ranks;
pub mod threads;

use crate::error::ExecError;
use ingot_compiler::ir::DType;

/// One rank's end of a group of ranks that average their gradients.
pub trait Collective: Send {
    /// This rank's number, `0..ranks()`.
    fn rank(&self) -> usize;
    /// How many ranks the group has.
    fn ranks(&self) -> usize;
    /// Replaces `data` (little-endian elements of `dtype`, host memory) by the elementwise sum
    /// over the ranks of every rank's `data`. Every rank must call it with the same length and
    /// dtype, in the same order; a mismatch is an error on every rank, not a hang.
    fn all_reduce_sum(&mut self, data: &mut [u8], dtype: DType) -> Result<(), ExecError>;
    /// Writes every rank's `send` into `recv` (`ranks()` times its length), rank 0's first.
    /// Every rank must call it with the same length, in the same order as its other
    /// collectives; a mismatch is an error on every rank, not a hang.
    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<(), ExecError>;
    /// Writes into `recv` this rank's part of the elementwise sum over the ranks of every
    /// rank's `send` (little-endian elements of `dtype`): rank `r` gets bytes
    /// `r * recv.len() .. (r + 1) * recv.len()` of it, `send` being `ranks()` times `recv`'s
    /// length. Those bytes equal, bit for bit, the same bytes of [`Collective::all_reduce_sum`]
    /// of the same buffers. Every rank must call it with the same lengths and dtype, in the
    /// same order as its other collectives; a mismatch is an error on every rank, not a hang.
    fn reduce_scatter_sum(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
    ) -> Result<(), ExecError>;
}

/// The error of a step compiled for `ranks` ranks run without a collective of that size.
pub fn needs_collective(ranks: usize, got: Option<usize>) -> ExecError {
    ExecError::Invalid {
        op: "all_reduce",
        reason: match got {
            None => format!(
                "the step is compiled for {ranks} data-parallel ranks but runs without a \
                 collective: give it one (`ingot train --ranks {ranks}`, or \
                 `PlannedStep::set_collective`)"
            ),
            Some(n) => format!(
                "the step is compiled for {ranks} data-parallel ranks but its collective has {n}"
            ),
        },
    }
}
