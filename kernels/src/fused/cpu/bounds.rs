//! Checks that a run's buffers fit: every input and output inside the arena and outside the
//! scratch region, one buffer for each of the kernel's inputs and outputs. The interpreter and
//! the compiled programs make the same checks, so they refuse the same runs.

use super::consts::R;
use crate::fused::check::KernelError;
use crate::fused::FusedKernel;

/// The end of a scratch region of `bytes` at `scratch`, if it fits in an arena of `mem` bytes.
pub(super) fn scratch_end(scratch: usize, bytes: usize, mem: usize) -> R<usize> {
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
pub(super) fn check_inputs(
    k: &FusedKernel,
    inputs: &[usize],
    mem: usize,
    s0: usize,
    s1: usize,
) -> R {
    for (n, (inp, &off)) in k.inputs.iter().zip(inputs).enumerate() {
        let bytes = inp.len.saturating_mul(inp.dtype.size());
        check_range("input", n, off, bytes, mem, s0, s1)?;
    }
    Ok(())
}

/// Checks that `[offset, offset + bytes)` fits in `mem` and stays out of the scratch region.
pub(super) fn check_range(
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
