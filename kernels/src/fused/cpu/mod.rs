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

use super::check::{checked_numel, code_dtype, operands};
use super::{FusedKernel, Inst, KernelError};
use crate::cpu::reduce::{keep_max, Cascade, FAN, LEVELS, RUN_BLOCK};
use crate::cpu::scalar::{Float, Num};
use crate::cpu::Scalar;
use crate::dtype::{bf16_from_f64, quantize_bf16};
use crate::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

mod analysis;
mod columns;
pub mod compiled;
#[macro_use]
mod lanes;
mod liveness;
mod plan;
mod reduce;
mod rows;

use analysis::*;
pub use compiled::Compiled;
use lanes::*;
use liveness::Buffers;
use plan::*;
use reduce::*;

type R<T = ()> = Result<T, KernelError>;

/// Alignment of every region carved from the scratch.
const ALIGN: usize = 64;
const MAX_LANES: usize = 1024;
const MIN_LANES: usize = 16;
/// Lanes × instructions to aim for.
const LANE_BUDGET: usize = 8192;
/// Bytes per lane in a lane buffer (the widest dtype).
const WORD: usize = 8;
/// Elements in a reduction's accumulator slot (rows case): eight partials, then the row's
/// cascade of block sums (its level 0 at [`RUNS`], which ends as the row's result; a max
/// folds its runs there).
const SLOT: usize = 16;
const RUNS: usize = 8;
const _: () = assert!(RUNS + LEVELS <= SLOT);

// Instruction flags.
const ROW: usize = 1;
/// Evaluated per chunk in the passes (full; in the flat case, every instruction).
const XFULL: usize = 2;
const LIVE: usize = 4;
/// A row-level value that full instructions read lane by lane (rows case).
const BCAST: usize = 8;
const OUT_FULL: usize = 16;
/// Computed from constants only: evaluated once per run, on every lane.
const CONST: usize = 32;
/// A full load that may be read in place (from the input's memory) instead of copied.
const DIRECT: usize = 64;
/// `src` entry of a value that is in its lane buffer.
const IN_BUFFER: usize = usize::MAX;
/// Padding between lane buffers, so that they do not all map to the same cache sets.
const SKEW: usize = 192;

// Axis flags.
const AX_RED: usize = 1;
const AX_T: usize = 2;

/// Bytes of scratch that [`run`] needs for `k`, alignment slack included: the analysis's
/// tables (which grow with the numbers of instructions, reductions, axes and inputs) and one
/// lane buffer per value live at once (the `liveness` module). [`run`] lays out its scratch with the
/// same function, so the planner and the run agree to the byte. 0 if the counts overflow (then
/// [`run`] refuses the kernel); for a kernel that does not check, the tables' bytes (then
/// [`run`] names what is wrong with it).
pub fn scratch_bytes(k: &FusedKernel) -> usize {
    let Some(tables) = Layout::tables(k) else {
        return 0;
    };
    let mut words = Vec::new();
    if words
        .try_reserve_exact(tables.meta_bytes / size_of::<usize>())
        .is_err()
    {
        return tables.total;
    }
    words.resize(tables.meta_bytes / size_of::<usize>(), 0usize);
    prepare(k, &mut words, &tables).map_or(tables.total, |(_, _, lay)| lay.total)
}

/// Checks `k` into the tables carved from `words`, analyses it and gives its values lane
/// buffers: the tables, the analysis and the whole scratch's layout. The one place that
/// decides the scratch's size, for [`scratch_bytes`] and [`run`] alike.
fn prepare<'a>(
    k: &FusedKernel,
    words: &'a mut [usize],
    tables: &Layout,
) -> R<(Meta<'a>, Info, Layout)> {
    let mut m = Meta::carve(words, k, tables.pb)?;
    k.check_into(m.dt)?;
    let info = analyze(k, &mut m, tables.pb)?;
    let b: Buffers = liveness::assign(k, &mut m, &info)?;
    let lay = tables
        .with(k, b)
        .ok_or_else(|| KernelError::DomainTooLarge {
            domain: k.domain.clone(),
        })?;
    Ok((m, info, lay))
}

/// Lanes per chunk for a body of `n` instructions over `numel` domain elements: up to 1024,
/// fewer for long bodies, so that the lane buffers of f32 values stay near 32 KiB (most of them
/// are dead at any one time), and no more than the smallest power of two (at least
/// [`MIN_LANES`]) that covers the domain: no chunk of any case is longer than the domain, so
/// lanes beyond it would be scratch that nothing reads (a kernel over 64 elements took 1,024
/// lanes, 8 KiB a buffer). Every chunk keeps its length, so results do not change.
fn lane_count(n: usize, numel: usize) -> usize {
    let by_body = ((LANE_BUDGET / n.max(1)) / 8 * 8).clamp(MIN_LANES, MAX_LANES);
    let by_domain = numel
        .checked_next_power_of_two()
        .unwrap_or(MAX_LANES)
        .clamp(MIN_LANES, MAX_LANES);
    by_body.min(by_domain)
}

/// The end of a scratch region of `bytes` at `scratch`, if it fits in an arena of `mem` bytes.
fn scratch_end(scratch: usize, bytes: usize, mem: usize) -> R<usize> {
    match scratch.checked_add(bytes) {
        Some(e) if e <= mem => Ok(e),
        _ => Err(KernelError::BufferOutOfRange {
            what: "scratch",
            index: 0,
            offset: scratch,
            bytes,
            mem,
        }),
    }
}

/// Checks that every input fits in the arena outside the scratch region `[s0, s1)`.
fn check_inputs(k: &FusedKernel, inputs: &[usize], mem: usize, s0: usize, s1: usize) -> R {
    for (n, (inp, &off)) in k.inputs.iter().zip(inputs).enumerate() {
        let bytes = inp.len.saturating_mul(inp.dtype.size());
        check_range("input", n, off, bytes, mem, s0, s1)?;
    }
    Ok(())
}

/// Checks that `[offset, offset + bytes)` fits in `mem` and stays out of the scratch region.
fn check_range(
    what: &'static str,
    index: usize,
    offset: usize,
    bytes: usize,
    mem: usize,
    s0: usize,
    s1: usize,
) -> R {
    let end = offset.checked_add(bytes).filter(|&e| e <= mem);
    let Some(end) = end else {
        return Err(KernelError::BufferOutOfRange {
            what,
            index,
            offset,
            bytes,
            mem,
        });
    };
    if bytes > 0 && end > s0 && offset < s1 {
        return Err(KernelError::ScratchOverlap {
            what,
            index,
            offset,
            end,
            scratch_start: s0,
            scratch_end: s1,
        });
    }
    Ok(())
}

/// Runs `k` over buffers in the arena `mem`: input `n` is the `len × size` bytes at
/// `inputs[n]`, output `j` the [`FusedKernel::output_len`] elements at `outputs[j]`, and
/// `scratch` the start of [`scratch_bytes`]`(k)` bytes the run may use. Offsets need no
/// particular alignment. Outputs are written, inputs only read; an output may be the same
/// memory as an input where [`FusedKernel::can_write_over`] allows it (other overlaps give
/// unspecified values, but nothing worse).
///
/// Checks the kernel ([`FusedKernel::check`]) and that every buffer fits in `mem` outside the
/// scratch region before it writes anything but scratch. Allocates nothing on the heap unless it
/// returns an error.
pub fn run(
    k: &FusedKernel,
    mem: &mut [u8],
    inputs: &[usize],
    outputs: &[usize],
    scratch: usize,
) -> R {
    check_buffer_counts(k, inputs, outputs)?;
    let too_large = || KernelError::DomainTooLarge {
        domain: k.domain.clone(),
    };
    let tables = Layout::tables(k).ok_or_else(too_large)?;
    let mem_len = mem.len();
    let s0 = scratch;
    // The tables first (the analysis decides the rest), then the whole scratch.
    let s1 = scratch_end(scratch, tables.total, mem_len)?;
    check_inputs(k, inputs, mem_len, s0, s1)?;
    let (lo, rest) = mem.split_at_mut(s0);
    let pad = (ALIGN - rest.as_ptr() as usize % ALIGN) % ALIGN;
    let (meta_b, tail) = rest.split_at_mut(pad + tables.meta_bytes);
    let words = <[usize]>::mut_from_bytes(&mut meta_b[pad..])
        .map_err(|_| KernelError::Internal("scratch misaligned"))?;
    let (m, info, lay) = prepare(k, words, &tables)?;
    let s1 = scratch_end(scratch, lay.total, mem_len)?;
    check_inputs(k, inputs, mem_len, s0, s1)?;
    let (sc, hi) = tail.split_at_mut(lay.total - pad - tables.meta_bytes);
    let (bufs, rest) = sc.split_at_mut(lay.buf_bytes);
    let (parts, rest) = rest.split_at_mut(lay.part_bytes);
    let levels = sub_mut(rest, 0, lay.level_bytes)?;

    let numel = checked_numel(&k.domain).ok_or_else(too_large)?;
    let rows = k
        .domain
        .iter()
        .enumerate()
        .filter(|(d, _)| k.reduce_axes.binary_search(d).is_err())
        .try_fold(1usize, |n, (_, &d)| n.checked_mul(d))
        .ok_or_else(too_large)?;
    for (j, (out, &off)) in k.outputs.iter().zip(outputs).enumerate() {
        let v = out.value;
        let n = if m.flags[v] & ROW != 0 { rows } else { numel };
        let bytes = n.saturating_mul(code_dtype(m.dt[v]).size());
        check_range("output", j, off, bytes, mem_len, s0, s1)?;
    }
    // With an empty domain only row-level outputs have elements.
    let row_outputs = k.outputs.iter().any(|o| m.flags[o.value] & ROW != 0);
    if k.outputs.is_empty() || (numel == 0 && !row_outputs) {
        return Ok(());
    }

    let Meta {
        dt,
        flags,
        src,
        slot,
        part,
        eval_start,
        eval,
        acc_start,
        acc,
        stage_start,
        stage,
        idx,
        axis,
        t_axes,
        o_axes,
        k_axes,
        blk,
        step,
        ..
    } = m;
    let plan = Plan {
        k,
        dt,
        flags,
        slot,
        part,
        eval_start,
        eval,
        acc_start,
        acc,
        stage_start,
        stage,
        axis,
        t_axes: &t_axes[..info.nt],
        o_axes: &o_axes[..info.no],
        k_axes: &k_axes[..info.nk],
        blk,
        step,
        case: info.case,
        passes: info.passes,
        n_t: info.n_t,
        n_o: o_axes[..info.no]
            .iter()
            .fold(1usize, |n, &a| n.saturating_mul(k.domain[a])),
        lanes: lay.lanes,
        stride: lay.lanes * WORD + SKEW,
        numel,
        rows,
        inputs,
        outputs,
        s0,
        s1,
    };
    let mut st = State {
        idx,
        src,
        bufs,
        parts,
        levels,
        lo,
        hi,
    };
    // Values of constants only are the same everywhere: computed once, on every lane.
    for i in 0..k.body.len() {
        if plan.flags[i] & (LIVE | CONST) == LIVE | CONST {
            plan.eval(&mut st, i, plan.lanes, 0)?;
        }
    }
    match plan.case {
        Case::Flat => plan.run_flat(&mut st),
        Case::Rows => plan.run_rows(&mut st),
        Case::Columns => plan.run_columns(&mut st),
    }
}

/// That `inputs` and `outputs` name one buffer for each of `k`'s inputs and outputs.
pub(super) fn check_buffer_counts(k: &FusedKernel, inputs: &[usize], outputs: &[usize]) -> R {
    for (what, expected, given) in [
        ("inputs", k.inputs.len(), inputs.len()),
        ("outputs", k.outputs.len(), outputs.len()),
    ] {
        if given != expected {
            return Err(KernelError::BufferCount {
                what,
                expected,
                given,
            });
        }
    }
    Ok(())
}

/// Runs `k` on separate buffers: `inputs[n]` holds input `n`'s bytes (native endianness,
/// exactly `len × size` of them; bool is one byte, 0 or 1). Returns each output's bytes,
/// [`FusedKernel::output_len`] elements of [`FusedKernel::output_dtype`]. Allocates an arena,
/// copies the inputs in and the outputs out; meant for tests and reference interpreters.
pub fn run_buffers(k: &FusedKernel, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>, KernelError> {
    k.check()?;
    if inputs.len() != k.inputs.len() {
        return Err(KernelError::BufferCount {
            what: "inputs",
            expected: k.inputs.len(),
            given: inputs.len(),
        });
    }
    let too_large = |what, index, bytes| KernelError::BufferOutOfRange {
        what,
        index,
        offset: 0,
        bytes,
        mem: usize::MAX,
    };
    // Buffers one after another, 256-aligned as the planner places them.
    let place = |at: usize, bytes: usize| -> Option<usize> {
        at.checked_add(bytes)?.checked_next_multiple_of(256)
    };
    let mut at = 0usize;
    let mut in_off = Vec::with_capacity(inputs.len());
    for (n, (inp, bytes)) in k.inputs.iter().zip(inputs).enumerate() {
        let want = inp.len.saturating_mul(inp.dtype.size());
        if bytes.len() != want {
            return Err(KernelError::BufferOutOfRange {
                what: "input",
                index: n,
                offset: 0,
                bytes: want,
                mem: bytes.len(),
            });
        }
        in_off.push(at);
        at = place(at, want).ok_or(too_large("input", n, want))?;
    }
    let mut out_off = Vec::with_capacity(k.outputs.len());
    let mut out_bytes = Vec::with_capacity(k.outputs.len());
    for j in 0..k.outputs.len() {
        let b = k.output_len(j).saturating_mul(k.output_dtype(j).size());
        out_off.push(at);
        out_bytes.push(b);
        at = place(at, b).ok_or(too_large("output", j, b))?;
    }
    let scratch = at;
    let sb = scratch_bytes(k);
    let total = at.checked_add(sb).ok_or(too_large("scratch", 0, sb))?;
    let mut mem = Vec::new();
    mem.try_reserve_exact(total)
        .map_err(|_| too_large("arena", 0, total))?;
    mem.resize(total, 0u8);
    for (&off, bytes) in in_off.iter().zip(inputs) {
        mem[off..off + bytes.len()].copy_from_slice(bytes);
    }
    run(k, &mut mem, &in_off, &out_off, scratch)?;
    Ok(out_off
        .iter()
        .zip(&out_bytes)
        .map(|(&o, &b)| mem[o..o + b].to_vec())
        .collect())
}
