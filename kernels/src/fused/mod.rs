//! The fused-kernel description: what one kernel launch computes, as plain data.
//!
//! A fused kernel replaces a group of the IR's elementwise ops, view ops (broadcast, transpose,
//! slice, reshape) and reductions, so that the group's intermediates live in registers instead
//! of memory. The compiler's fusion pass writes these descriptions; [`cpu`] runs them on the
//! host; the CUDA code generator turns them into CUDA C. This module is the contract between
//! them, so it says exactly what a kernel means.
//!
//! # Meaning
//! A kernel has an iteration **domain** (a row-major shape) and a set of **reduce axes** of that
//! domain. Its body is a list of instructions in SSA form: each instruction names earlier ones
//! by index. Every instruction has a value at every domain index `i`:
//! - [`Inst::Load`] reads input `n` at element `access.offset + Σ_d access.strides[d] * i[d]`
//!   (a stride of 0 broadcasts; permuted strides transpose; the offset slices);
//! - [`Inst::Const`] is the same scalar everywhere, `value` converted as the IR's `full` does
//!   (a Rust `as` cast; for bool, nonzero is true); [`Inst::Index`] is `i[axis]`, converted the
//!   same way;
//! - unary, binary, compare, select and convert apply the scalar op to their operands' values
//!   at the same `i` (semantics as the IR's ops of the same names: integer arithmetic wraps,
//!   `div` is float-only, converts are Rust `as` casts, to
//!   bool is "nonzero"; float `max`/`min` propagate NaN);
//! - [`Inst::Reduce`]`{x}` at `i` folds `x` over every domain index `j` that agrees with `i`
//!   outside the reduce axes (sum from 0, integer sums wrapping; max from the lowest value,
//!   where a term replaces the running max when strictly greater or NaN, so NaN propagates
//!   and of `0.0` and `-0.0` the earlier stays). The terms come in row-major order of `j`, and
//!   are combined in the fixed order [`crate::cpu::reduce()`] uses for a tensor shaped like the
//!   domain, so that a fused reduction gives the unfused op's bits on the CPU: if the innermost
//!   axis of size > 1 is reduced, each contiguous run along the trailing reduced axes goes, in
//!   blocks of [`crate::cpu::reduce::RUN_BLOCK`] terms, to eight interleaved partials combined
//!   pairwise, and the blocks of a run and the runs of a row are combined by cascades;
//!   otherwise each lane's terms go to a cascade (see [`crate::cpu::reduce::Cascade`]: no
//!   accumulator takes more than `BLOCK` terms, so sums stay accurate at any length). When
//!   every reduce axis has size 1 the
//!   reduction is `x` itself (a copy, as the unfused reduce makes it). Other executors (CUDA)
//!   may combine sums in another order.
//!
//! An instruction is **full** if its value can vary along a reduce axis, and **row-level**
//! (uniform along the reduce axes) otherwise: a load whose strides on every reduce axis are 0, a
//! constant, an index along a non-reduce axis, a reduction, and any op over row-level operands
//! are row-level. With no reduce axes every instruction is row-level, and the kernel is a plain
//! elementwise loop.
//!
//! Each [`Output`] stores one instruction contiguously in row-major order: a full instruction at
//! every domain index (`numel(domain)` elements), a row-level one once per row, i.e. over the
//! domain with every reduce axis taken as size 1.
//!
//! Softmax over the last axis of `x [r, n]`, for instance, is the domain `[r, n]`, reduce axes
//! `[1]`, and the body `x = load 0; m = reduce max x; d = x - m; e = exp d; s = reduce sum e;
//! y = e / s`, with `y` the one output. Executors evaluate it in passes over each row (one pass
//! per reduction level, recomputing full values as needed), never storing a full intermediate.
//!
//! Loads stay inside their inputs (see [`FusedKernel::check`]): over the domain, and for an
//! input whose strides on every reduce axis are 0 over the rows too, since a row-level value is
//! computed for every row even when a reduce axis has size 0.
//!
//! # In place
//! An output may be written over an input (the planner lets it take the input's memory) when
//! [`FusedKernel::can_write_over`] says so: the input is read only at the output's own index,
//! and full outputs are written in the last pass over each row, after every read of that row.
//! This assumes no other input of the kernel is the same buffer.

pub mod check;
pub mod cpu;
pub mod distribute;
mod kernel;
pub mod parts;
pub mod random;
pub mod sample;
pub mod split;
pub mod staged;

pub use check::KernelError;
pub use kernel::{Access, FusedKernel, Input, Inst, Output};
