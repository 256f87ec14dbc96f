//! Where a compiled program reads and writes: the arena outside the scratch ([`Io`]: the
//! kernel's inputs and outputs, f32 or bool), the scratch itself ([`Arena`]), and the helpers
//! that split lane buffers and blocks of rows between the steps that read and write them.

use super::body::{bool_f32, Src};
use super::consts::R;
use crate::fused::check::KernelError;
use zerocopy::FromBytes;

/// The arena of a compiled program's run once [`Compiled::run`](super::compiled::Compiled::run) has checked it: the bytes
/// outside the scratch, where the inputs and outputs are, and the scratch from its first
/// [`ALIGN`](super::consts::ALIGN)ed byte.
pub(super) struct Arena<'m> {
    pub(super) io: Io<'m>,
    pub(super) scratch: &'m mut [u8],
}

/// The arena outside the scratch `[s0, s1)` (`lo` is `[0, s0)`, `hi` is from `s1` on), and
/// the offsets of the kernel's inputs and outputs in it.
pub(super) struct Io<'m> {
    pub(super) lo: &'m mut [u8],
    pub(super) hi: &'m mut [u8],
    pub(super) s0: usize,
    pub(super) s1: usize,
    pub(super) inputs: &'m [usize],
    pub(super) outputs: &'m [usize],
}

impl Io<'_> {
    /// The `n` f32 of input `q`.
    pub(super) fn input(&self, q: usize, n: usize) -> R<&[f32]> {
        let a = *self
            .inputs
            .get(q)
            .ok_or(KernelError::Internal("input index"))?;
        let b = super::plan::region(
            &*self.lo,
            &*self.hi,
            self.s0,
            self.s1,
            a,
            n.saturating_mul(4),
        )?;
        <[f32]>::ref_from_bytes(b).map_err(|_| KernelError::Internal("input misaligned"))
    }

    /// The `n` elements of input `q`: f32, or bools (one byte each) where `bool`.
    pub(super) fn source(&self, q: usize, n: usize, bool: bool) -> R<Source<'_>> {
        if !bool {
            return Ok(Source::F32(self.input(q, n)?));
        }
        let a = *self
            .inputs
            .get(q)
            .ok_or(KernelError::Internal("input index"))?;
        let b = super::plan::region(&*self.lo, &*self.hi, self.s0, self.s1, a, n)?;
        Ok(Source::Bool(b))
    }

    /// The `n` f32 of output `o`.
    pub(super) fn output(&mut self, o: usize, n: usize) -> R<&mut [f32]> {
        let a = *self
            .outputs
            .get(o)
            .ok_or(KernelError::Internal("output index"))?;
        let (s0, s1, bytes) = (self.s0, self.s1, n.saturating_mul(4));
        let b = super::plan::region(&mut *self.lo, &mut *self.hi, s0, s1, a, bytes)?;
        <[f32]>::mut_from_bytes(b).map_err(|_| KernelError::Internal("output misaligned"))
    }

    /// The `n` elements of output `o`: f32, or bools (one byte each) where `bool`.
    pub(super) fn dest(&mut self, o: usize, n: usize, bool: bool) -> R<Dest<'_>> {
        if !bool {
            return Ok(Dest::F32(self.output(o, n)?));
        }
        let a = *self
            .outputs
            .get(o)
            .ok_or(KernelError::Internal("output index"))?;
        let (s0, s1) = (self.s0, self.s1);
        let b = super::plan::region(&mut *self.lo, &mut *self.hi, s0, s1, a, n)?;
        Ok(Dest::Bool(b))
    }

    /// Stores the row-level outputs among `outputs` (those marked `true`), `total` elements
    /// each, at `start .. start + n`: each from its row buffer (buffer `b` at `b * stride` in
    /// `rows`) or its constant. A rows program's group of rows and a columns program's block
    /// of columns both end so.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn store_rows(
        &mut self,
        outputs: &[(Src, bool)],
        out_bool: &[bool],
        rows: &[f32],
        stride: usize,
        total: usize,
        start: usize,
        n: usize,
    ) -> R {
        for (o, &(src, per_row)) in outputs.iter().enumerate() {
            if !per_row {
                continue;
            }
            let mut d = self.dest(o, total, out_bool.get(o) == Some(&true))?;
            match src {
                Src::Row(b) => d.put(start, super::lanes::sub(rows, b * stride, n)?)?,
                Src::Const(c) => d.fill(start, n, c)?,
                Src::Lanes(_) => return Err(KernelError::Internal("full value stored per row")),
            }
        }
        Ok(())
    }
}

/// An input's elements: f32, or bools (bytes, 0 or 1) that programs hold as 0.0 and 1.0 (what
/// compares give), which only selects read, as their condition.
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    F32(&'a [f32]),
    Bool(&'a [u8]),
}

impl Source<'_> {
    /// Element `i`, as a program holds it.
    pub(super) fn get(&self, i: usize) -> Option<f32> {
        match self {
            Source::F32(s) => s.get(i).copied(),
            Source::Bool(s) => s.get(i).map(|&b| bool_f32(b != 0)),
        }
    }
}

/// An output's elements: f32, or bools (a byte each: 1 where the lane is not 0.0).
pub(super) enum Dest<'a> {
    F32(&'a mut [f32]),
    Bool(&'a mut [u8]),
}

impl Dest<'_> {
    /// Stores `v` at elements `at ..`.
    pub(super) fn put(&mut self, at: usize, v: &[f32]) -> R {
        match self {
            Dest::F32(d) => super::lanes::sub_mut(d, at, v.len())?.copy_from_slice(v),
            Dest::Bool(d) => {
                for (d, &x) in super::lanes::sub_mut(d, at, v.len())?.iter_mut().zip(v) {
                    *d = u8::from(x != 0.0);
                }
            }
        }
        Ok(())
    }

    /// Stores `c` at elements `at .. at + n`.
    pub(super) fn fill(&mut self, at: usize, n: usize, c: f32) -> R {
        match self {
            Dest::F32(d) => super::lanes::sub_mut(d, at, n)?.fill(c),
            Dest::Bool(d) => super::lanes::sub_mut(d, at, n)?.fill(u8::from(c != 0.0)),
        }
        Ok(())
    }
}

/// Buffer `i` of the `w`-long buffers in `bufs` split from the others for a step that writes
/// its first `len` elements and reads the others: the buffers before it, its elements, the
/// buffers after it, and where it ends (the gap [`other`](super::lane_loops::other) steps over). `what` names the
/// buffers in the error when `i` is past them.
#[allow(clippy::type_complexity)]
pub(super) fn step_out<'b>(
    bufs: &'b mut [f32],
    i: usize,
    w: usize,
    len: usize,
    what: &'static str,
) -> R<(&'b [f32], &'b mut [f32], &'b [f32], usize)> {
    let end = i * w + w;
    if end > bufs.len() {
        return Err(KernelError::Internal(what));
    }
    let (before, rest) = bufs.split_at_mut(i * w);
    let (own, after) = rest.split_at_mut(w);
    let out = own.get_mut(..len).ok_or(KernelError::Internal(what))?;
    Ok((before, out, after, end))
}

/// Calls `f(start, n)` on the blocks of `size` (the last one shorter) that cover `0 .. total`,
/// in order: a rows program's groups of rows, a columns program's blocks of columns.
pub(super) fn in_blocks(total: usize, size: usize, mut f: impl FnMut(usize, usize) -> R) -> R {
    let mut start = 0;
    while start < total {
        let n = size.min(total - start);
        f(start, n)?;
        start += n;
    }
    Ok(())
}
