//! The interpreter's entry points: how much scratch a kernel needs ([`scratch_bytes`]), running
//! it over buffers in one arena ([`run`]) or over separate buffers ([`run_buffers`]). The
//! strategy is in the [module docs](super); like the interpreter's other modules, this one
//! reads the names they share through its parent.

use super::analysis::Buffers;
use super::analysis::{analyze, Case, Info, Layout, Meta};
use super::bounds::{check_buffer_counts, check_inputs, check_range, scratch_end};
use super::consts::{ALIGN, CONST, LIVE, R, ROW, SKEW, WORD};
use super::lanes::sub_mut;
use super::liveness;
use super::plan::{Plan, State};
use crate::fused::check::{checked_numel, code_dtype, KernelError};
use crate::fused::kernel::FusedKernel;
use zerocopy::FromBytes;

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
pub(super) fn prepare<'a>(
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
