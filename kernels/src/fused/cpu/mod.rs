//! Running a fused kernel on the host.
//!
//! [`run`] executes a [`FusedKernel`] over buffers that live in one byte arena (the step's memory
//! slab): each input and output is a byte offset into it, and so is a scratch region of
//! [`scratch_bytes`] bytes that the caller plans. A run allocates nothing on the heap (the
//! kernel's analysis, its lane buffers and its loop indices all live in the scratch region)
//! and never panics: inconsistent arguments give a [`KernelError`].
//! [`run_buffers`] is the allocating convenience for tests and reference interpreters.
//!
//! # Strategy
//! Instructions are evaluated one at a time over a chunk of `L` lanes (`L` between 16 and 1024,
//! fewer for long bodies), each into a lane buffer in the scratch, so that dispatch costs
//! once per chunk and the loops over lanes vectorize. A lane buffer is reused once the last
//! reader of its value has run (the `liveness` module), so the scratch grows with the values live at
//! once, not with the kernel's length. Axes of size 1 are dropped (they change
//! no index); the remaining axes split three ways:
//! - **flat** (no reduce axis of size > 1): chunks are runs of `L` consecutive domain elements
//!   (row-major), every live instruction is evaluated per chunk and every output stored. A
//!   reduction over axes of size 1 is its operand (as [`crate::cpu::reduce()`] copies).
//! - **rows** (the innermost axis is reduced: softmax, layer norm): for each row (index of the
//!   kept axes) the kernel makes one pass over the row's reduced elements per reduction level,
//!   in chunks of `L` along the trailing reduced axes. Pass `p` evaluates the full instructions
//!   that reductions of level `p + 1` need (and, in the last pass, those the full outputs need,
//!   which are stored then). Row-level instructions are evaluated once per row, between the
//!   passes, and broadcast to the lanes that full instructions read. Full values a later pass
//!   needs are recomputed there, never stored.
//! - **columns** (the innermost axis is kept but some axis is reduced: a bias gradient summed
//!   over the batch): the same passes, but the lanes run across `L` consecutive indices of the
//!   trailing kept axes, so each pass walks the reduced indices with contiguous chunks and every
//!   lane accumulates its own reduction. Row-level values are lane vectors here.
//!
//! Values of constants only are computed once per run, on every lane. A binary op reads an
//! operand that is the same on every lane of the chunk (a constant; a row-level value in the
//! rows case) as one scalar. A full load whose chunk is contiguous and aligned in its input is
//! read in place; other loads copy their chunk into the lane buffer: a straight copy, a fill
//! where the access broadcasts, a gather otherwise (adjacent axes whose strides compose are
//! merged per input, so a transposed or sliced input splits chunks only where its layout does).
//! Results are identical whichever way a value is read.
//!
//! # Summation order
//! Reductions fold in exactly the order [`crate::cpu::reduce()`] uses for a tensor shaped like the
//! domain, so a fused reduction gives the unfused op's bits: in the rows case, each contiguous
//! run along the trailing reduced axes is folded, in blocks of [`RUN_BLOCK`] terms, into eight
//! interleaved partials combined as `((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7))`, and the block sums
//! of all the row's runs (a reduced axis before a kept one gives several), in row-major order,
//! go to a [`Cascade`] in the reduction's slot; in the columns case every lane's terms, in
//! row-major order, go to a cascade (its level 0 the lane buffer, the upper levels in scratch
//! that only kernels with more than [`FAN`] terms get). No accumulator takes more than
//! `RUN_BLOCK / 8` terms of a run or [`FAN`] other values one after another, so f32 sums stay
//! accurate at any length. Max does not cascade; it keeps the earlier of two equal values and
//! propagates NaN (`x > acc || x is NaN`).
//!
//! # bf16
//! A bf16 value lives in its lane buffer as the f32 it widens to, and every op computes on
//! those f32 lanes (reductions accumulate in f32): a load of a bf16 input widens it, an
//! instruction whose dtype is bf16 rounds its lanes to the nearest bf16 (ties to even) right
//! after it is evaluated (a reduction once, when it is finished), and a store narrows the
//! lanes (exactly, as they are rounded already). Each bf16 instruction therefore has the value
//! the unfused op computes and stores, so fusion changes no bit.
//!
//! # In place
//! Within a chunk every instruction is evaluated (every input element read, whether copied or
//! read in place) before any output is stored, and full outputs are stored in the last pass over
//! a row, after every read of that row. An output whose memory is an input that
//! [`FusedKernel::can_write_over`] allows is therefore read before it is overwritten, element by
//! element, whatever other outputs do.
//!
//! [`FusedKernel`]: crate::fused::FusedKernel
//! [`FusedKernel::can_write_over`]: crate::fused::FusedKernel::can_write_over
//! [`KernelError`]: crate::fused::KernelError
//! [`RUN_BLOCK`]: crate::cpu::reduce::RUN_BLOCK
//! [`FAN`]: crate::cpu::reduce::FAN
//! [`Cascade`]: crate::cpu::reduce::Cascade

mod analysis;
mod arena;
mod body;
mod bounds;
mod columns;
pub mod compiled;
mod consts;
mod lane_loops;
#[macro_use]
mod lanes;
// After `lanes`, whose macros it uses.
mod interpret;
mod liveness;
mod plan;
mod reduce;
mod rows;

pub use compiled::Compiled;
pub use interpret::{run, run_buffers, scratch_bytes};
