//! Fused kernels translated once, when a step is loaded, into straight-line programs of whole-chunk
//! loops: the fast path beside the interpreter ([`super::run`]), which stays the reference.
//!
//! # Why not interpret
//! The interpreter decides everything per chunk: each instruction's dtype, where its operands
//! are, whether a load can be read in place, which reductions a pass feeds. That costs little
//! over long chunks, but the rows that dominate a transformer's step on the CPU are short (a
//! layer norm's rows of `d_model`, a loss's rows of `vocab`), and the interpreter walks them one
//! row at a time: on the README's main job (rows of 64) it spent a third of the step on its own
//! bookkeeping. A [`Compiled`] kernel has made every such decision when it was built (each
//! operand is a lane buffer, a per-row value or a constant; each loop a monomorphised Rust loop
//! over `f32` that the compiler vectorises), and it runs **several short rows in one chunk**,
//! so that each instruction's dispatch is paid once per chunk of up to [`MAX_LANES`] lanes,
//! not once per row.
//!
//! # Which kernels
//! Kernels whose values are all `f32` (bools, from compares or bool inputs, read only by
//! selects, as their condition, or stored as outputs: a ReLU's mask), with loads,
//! constants, unary, binary, compare and select instructions and sum or max reductions, in the
//! interpreter's flat case or its rows case (the innermost axis of size > 1 reduced), whose
//! every input walks the inner axes with a single stride, as the programs of `rows`: the
//! kept axes outside, the reduced ones inside, wherever the reduced axes outside the inner
//! ones lie among the kept ones (a batch norm's `[N, C, H, W]` reduced over `[0, 2, 3]`:
//! several runs a row); and column reductions whose reduced axes all come before their
//! kept ones, as the programs of `columns`. [`Compiled::new`] says `None` for the
//! rest, which the interpreter runs as before: indices, converts, other dtypes (bf16
//! included), other column reductions, empty domains, and kernels whose program would not fit
//! in the scratch the planner reserved for the interpreter ([`super::scratch_bytes`]), which
//! is all a compiled kernel uses.
//!
//! # Threads
//! A program's rows (a column reduction's columns) are computed each alone, so
//! [`Compiled::run_rows`] runs any range of them with the bits the whole run gives them, and
//! [`Compiled::row_ranges`] cuts them for threads: the way to run on several threads a kernel
//! that [`crate::fused::parts`] cannot cut into smaller kernels (a batch norm with a full
//! output, whose outermost axis is reduced).
//!
//! # The same bits
//! Every value is computed by the same scalar functions the interpreter calls
//! ([`crate::cpu::Float`], [`crate::cpu::Num`], [`crate::cpu::Scalar`]), and every reduction of a
//! row folds through the interpreter's own accumulation functions (`acc_run` and `slot_op`: the
//! eight interleaved partials, blocks of [`RUN_BLOCK`](crate::cpu::reduce::RUN_BLOCK) and the cascade), one row at a time,
//! whichever rows share a chunk. Elementwise IEEE arithmetic gives the same result vectorised
//! or not (at any vector width: each instruction's lane loops are compiled for the widest
//! vectors the CPU has, [`crate::cpu::wide`]), so a compiled kernel writes the interpreter's bits; the tests hold it to that on
//! random kernels, on their pieces for 1, 2 and 3 threads, and on whole training steps.
//!
//! # In place
//! As in the interpreter: within a chunk every load happens before any store, and full outputs
//! are stored in the last pass, so an output written over an input that
//! [`FusedKernel::can_write_over`] allows is read before it is overwritten.

use super::arena::{Arena, Io};
use super::bounds::{check_buffer_counts, check_range};
use super::columns::Columns;
use super::consts::{ALIGN, R};
use super::rows::Program;
use crate::fused::check::KernelError;
use crate::fused::FusedKernel;
use std::ops::Range;

/// The most lanes a chunk holds.
pub const MAX_LANES: usize = 1024;

/// A fused kernel made into a program once, when a step is loaded: a flat or rows-case
/// `Program` (`rows`), or a column reduction (`columns`). See the
/// [module docs](self).
#[derive(Clone, Debug)]
pub struct Compiled(Kind);

#[derive(Clone, Debug)]
enum Kind {
    Rows(Program),
    Columns(Columns),
}

impl Compiled {
    /// The program for `k`, or `None` when `k` is outside what compiled kernels cover (see the
    /// [module docs](self)); then the interpreter runs it.
    pub fn new(k: &FusedKernel) -> Option<Compiled> {
        match Program::new(k) {
            Some(p) => Some(Compiled(Kind::Rows(p))),
            None => Columns::new(k).map(|c| Compiled(Kind::Columns(c))),
        }
    }

    /// Bytes of scratch the program uses: never more than [`super::scratch_bytes`] of its
    /// kernel, which is what the planner reserves.
    pub fn scratch_bytes(&self) -> usize {
        match &self.0 {
            Kind::Rows(p) => p.scratch,
            Kind::Columns(c) => c.scratch_bytes(),
        }
    }

    /// Lanes per chunk, and rows per chunk (a column reduction: terms per chunk), for reports
    /// and tests.
    pub fn shape(&self) -> (usize, usize) {
        match &self.0 {
            Kind::Rows(p) => p.shape(),
            Kind::Columns(c) => c.shape(),
        }
    }

    /// Whether this is a column reduction's program (`columns`).
    pub fn is_columns(&self) -> bool {
        matches!(self.0, Kind::Columns(_))
    }

    /// The parts that [`Compiled::run_rows`] can run apart, each on its own: the rows (indices
    /// of the kept axes) of a rows or flat program, the columns of a column reduction.
    pub fn rows(&self) -> usize {
        match &self.0 {
            Kind::Rows(p) => p.rows(),
            Kind::Columns(c) => c.cols(),
        }
    }

    /// [`Compiled::rows`] cut into at most `pieces` ranges of nearly equal size for threads,
    /// each of at least `min_elems` domain elements of `k` (the kernel the program was made
    /// from); `None` when that makes one range only. The ranges depend only on the program,
    /// `pieces` and `min_elems`, and tile the rows in order.
    pub fn row_ranges(
        &self,
        k: &FusedKernel,
        pieces: usize,
        min_elems: usize,
    ) -> Option<Vec<Range<usize>>> {
        let rows = self.rows();
        let numel = k.domain.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
        let n = pieces.min(rows).min(numel / min_elems.max(1));
        (n >= 2).then(|| (0..n).map(|p| rows * p / n..rows * (p + 1) / n).collect())
    }

    /// Runs the program of `k` (the kernel it was made from) as [`super::run`] runs `k`: the
    /// same arguments, checks and results, bit for bit. Buffers whose bytes are not aligned
    /// for f32 are left to the interpreter. Allocates nothing.
    pub fn run(
        &self,
        k: &FusedKernel,
        mem: &mut [u8],
        inputs: &[usize],
        outputs: &[usize],
        scratch: usize,
    ) -> R {
        if inputs.len() != k.inputs.len()
            || outputs.len() != k.outputs.len()
            || misaligned(mem, inputs, outputs)
        {
            return super::interpret::run(k, mem, inputs, outputs, scratch);
        }
        self.run_rows(k, mem, inputs, outputs, scratch, 0..self.rows())
    }

    /// Runs rows `rows` of the program of `k` ([`Compiled::rows`]): what [`Compiled::run`]
    /// writes for those rows and nothing else, bit for bit, whatever the other rows. So
    /// threads that each run their own range of rows, each with its own scratch, write
    /// disjoint elements and give the same bits on any number of threads. Buffers must be
    /// aligned for f32 here (else an error: the interpreter cannot run a range of rows).
    ///
    /// The checks and the split of `mem` around the scratch are the same for both kinds of
    /// program, so they are made here once and each program gets the `Arena`.
    pub fn run_rows(
        &self,
        k: &FusedKernel,
        mem: &mut [u8],
        inputs: &[usize],
        outputs: &[usize],
        scratch: usize,
        rows: Range<usize>,
    ) -> R {
        let (out_len, bytes, body) = match &self.0 {
            Kind::Rows(p) => (&p.out_len[..], p.scratch, p.body()),
            Kind::Columns(c) => (c.out_len(), c.scratch_bytes(), c.body()),
        };
        check_buffer_counts(k, inputs, outputs)?;
        if misaligned(mem, inputs, outputs) {
            return Err(KernelError::Internal(
                "a range of rows needs buffers aligned for f32",
            ));
        }
        let mem_len = mem.len();
        let s0 = scratch;
        let s1 = super::bounds::scratch_end(scratch, bytes, mem_len)?;
        super::bounds::check_inputs(k, inputs, mem_len, s0, s1)?;
        for (j, (&off, &len)) in outputs.iter().zip(out_len).enumerate() {
            let size = if body.out_bool[j] { 1 } else { 4 };
            check_range("output", j, off, len.saturating_mul(size), mem_len, s0, s1)?;
        }
        let (lo, rest) = mem.split_at_mut(s0);
        let (sc, hi) = rest.split_at_mut(bytes);
        let pad = (ALIGN - sc.as_ptr() as usize % ALIGN) % ALIGN;
        let arena = Arena {
            io: Io {
                lo,
                hi,
                s0,
                s1,
                inputs,
                outputs,
            },
            scratch: sc
                .get_mut(pad..)
                .ok_or(KernelError::Internal("compiled scratch"))?,
        };
        match &self.0 {
            Kind::Rows(p) => p.run_rows(arena, rows),
            Kind::Columns(c) => c.run_cols(arena, rows),
        }
    }
}

/// Whether some buffer's bytes are not aligned for f32 in `mem`.
fn misaligned(mem: &[u8], inputs: &[usize], outputs: &[usize]) -> bool {
    let base = mem.as_ptr() as usize;
    inputs
        .iter()
        .chain(outputs)
        .any(|&o| !(base.wrapping_add(o)).is_multiple_of(4))
}
