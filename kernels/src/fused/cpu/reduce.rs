//! Reductions over lane buffers, folded in the order `crate::cpu::reduce()` uses.

use super::consts::{R, RUNS, SLOT};
use super::lanes::{typed, typed_mut, NumElem};
use crate::cpu::reduce::{keep_max, Cascade, FAN, LEVELS, RUN_BLOCK};
use crate::fused::check::KernelError;
use crate::ReduceOp;

pub(super) fn identity<T: NumElem>(op: ReduceOp) -> T {
    match op {
        ReduceOp::Sum => T::ZERO,
        ReduceOp::Max => T::LOWEST,
    }
}

pub(super) fn fill_identity<T: NumElem>(op: ReduceOp, b: &mut [u8]) -> R {
    typed_mut::<T>(b)?.fill(identity(op));
    Ok(())
}

#[inline(always)]
pub(super) fn fold8<T: Copy>(x: &[T], p: &mut [T; 8], f: impl Fn(T, T) -> T) {
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            p[j] = f(p[j], c[j]);
        }
    }
    for (j, &v) in chunks.remainder().iter().enumerate() {
        p[j] = f(p[j], v);
    }
}

/// The eight partials of a block combined, `((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7))`.
#[inline(always)]
pub(super) fn combine8<T: Copy>(s: &[T], f: impl Fn(T, T) -> T) -> T {
    f(
        f(f(s[0], s[4]), f(s[2], s[6])),
        f(f(s[1], s[5]), f(s[3], s[7])),
    )
}

/// Rows case: folds a chunk, at position `p0` of its run (a multiple of 8), into the slot's
/// eight interleaved partials; a sum's partials restart at every multiple of [`RUN_BLOCK`],
/// after their block's sum goes to the row's cascade as value `first + p / RUN_BLOCK - 1`
/// (`first`: the run's first block's index in the row), as [`crate::cpu::reduce()`] does.
pub(super) fn acc_run<T: NumElem>(
    op: ReduceOp,
    x: &[u8],
    slot: &mut [u8],
    p0: usize,
    first: usize,
) -> R {
    let x = typed::<T>(x)?;
    let slot = typed_mut::<T>(slot)?;
    if slot.len() < SLOT {
        return Err(KernelError::Internal("reduction slot"));
    }
    let mut p = [T::ZERO; 8];
    p.copy_from_slice(&slot[..8]);
    match op {
        ReduceOp::Sum => {
            let (mut pos, mut rest) = (p0, x);
            while !rest.is_empty() {
                if pos > 0 && pos.is_multiple_of(RUN_BLOCK) {
                    let b = combine8(&p, T::add);
                    Cascade::push(
                        &mut slot[RUNS..RUNS + LEVELS],
                        first + pos / RUN_BLOCK - 1,
                        b,
                    );
                    p = [T::ZERO; 8];
                }
                let take = rest.len().min(RUN_BLOCK - pos % RUN_BLOCK);
                fold8(&rest[..take], &mut p, T::add);
                pos += take;
                rest = &rest[take..];
            }
        }
        ReduceOp::Max => fold8(x, &mut p, keep_max),
    }
    slot[..8].copy_from_slice(&p);
    Ok(())
}

/// What [`slot_op`] does to a rows-case reduction slot.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotStep {
    /// A pass over a row starts: the row's cascade (or fold) is empty.
    StartRow,
    /// A run starts: partials at the identity.
    StartRun,
    /// A run ends: its last block goes to the row's cascade (a max's run into the row's fold).
    EndRun,
    /// The row's runs are all in: its result is collected at [`RUNS`].
    EndRow,
}

/// Where a run is among its row's (rows case).
#[derive(Clone, Copy)]
pub(super) struct Runs {
    /// Whether a row has several runs (then a max folds them, else the run is the row's).
    pub(super) multi: bool,
    /// The run's index in its row (for `EndRun`).
    pub(super) index: usize,
    /// Runs per row.
    pub(super) count: usize,
    /// Elements per run.
    pub(super) len: usize,
}

pub(super) fn slot_op<T: NumElem>(op: ReduceOp, slot: &mut [u8], what: SlotStep, runs: Runs) -> R {
    let s = typed_mut::<T>(slot)?;
    if s.len() < SLOT {
        return Err(KernelError::Internal("reduction slot"));
    }
    let id = identity::<T>(op);
    let blocks = runs.len.div_ceil(RUN_BLOCK);
    match (what, op) {
        (SlotStep::StartRow, _) => s[RUNS..RUNS + LEVELS].fill(id),
        (SlotStep::StartRun, _) => s[..8].fill(id),
        (SlotStep::EndRun, ReduceOp::Sum) if blocks == 0 => {}
        (SlotStep::EndRun, ReduceOp::Sum) => {
            let last = combine8(&s[..8], T::add);
            let k = (runs.index + 1) * blocks - 1;
            Cascade::push(&mut s[RUNS..RUNS + LEVELS], k, last);
        }
        (SlotStep::EndRun, ReduceOp::Max) => {
            let run = combine8(&s[..8], keep_max);
            s[RUNS] = if runs.multi {
                keep_max(s[RUNS], run)
            } else {
                run
            };
        }
        (SlotStep::EndRow, ReduceOp::Sum) => {
            let n = runs.count.saturating_mul(blocks);
            s[RUNS] = Cascade::finish(&s[RUNS..RUNS + LEVELS], n);
        }
        (SlotStep::EndRow, ReduceOp::Max) => {}
    }
    Ok(())
}

/// Columns case: every lane folds its own term, the `term`-th; a sum's lanes cascade (their
/// upper levels in `upper`, which may be empty when no lane takes more than [`FAN`] terms).
pub(super) fn acc_lanes<T: NumElem>(
    op: ReduceOp,
    x: &[u8],
    acc: &mut [u8],
    upper: &mut [u8],
    term: usize,
) -> R {
    let x = typed::<T>(x)?;
    let acc = typed_mut::<T>(acc)?;
    match op {
        ReduceOp::Sum if term > 0 && term.is_multiple_of(FAN) => {
            let upper = typed_mut::<T>(upper)?;
            if upper.len() < (LEVELS - 1) * acc.len() {
                return Err(KernelError::Internal("cascade levels"));
            }
            Cascade::push_lanes(acc, upper, term, x);
        }
        ReduceOp::Sum => {
            for (a, &v) in acc.iter_mut().zip(x) {
                *a = a.add(v);
            }
        }
        ReduceOp::Max => {
            for (a, &v) in acc.iter_mut().zip(x) {
                *a = keep_max(*a, v);
            }
        }
    }
    Ok(())
}

/// Columns case: a sum's lanes after `n` terms, their cascade levels collected.
pub(super) fn finish_cascade_lanes<T: NumElem>(acc: &mut [u8], upper: &mut [u8], n: usize) -> R {
    if n <= FAN {
        return Ok(());
    }
    let acc = typed_mut::<T>(acc)?;
    let upper = typed::<T>(upper)?;
    if upper.len() < (LEVELS - 1) * acc.len() {
        return Err(KernelError::Internal("cascade levels"));
    }
    Cascade::finish_lanes(acc, upper, n);
    Ok(())
}
