//! Execution: the analysed kernel walked chunk by chunk, pass by pass.

use super::analysis::{list, Case};
use super::consts::{AX_RED, AX_T, BCAST, CONST, DIRECT, IN_BUFFER, R, ROW, SLOT, WORD, XFULL};
use super::lanes::{
    binary, binary_float, compare, convert, fill_bytes, fill_const, gather, quantize_lanes, select,
    sub, sub_mut, typed, typed_mut, unary, unary_float, widen_bf16, Arg, Elem,
};
use super::reduce::{
    acc_lanes, acc_run, fill_identity, finish_cascade_lanes, slot_op, Runs, SlotStep,
};
use crate::cpu::reduce::{LEVELS, RUN_BLOCK};
use crate::fused::check::{code_dtype, KernelError};
use crate::fused::kernel::{FusedKernel, Inst};
use crate::{DType, ReduceOp};

// Execution.

/// The analysed kernel and where its buffers are.
pub(super) struct Plan<'a> {
    pub(super) k: &'a FusedKernel,
    pub(super) dt: &'a [usize],
    pub(super) flags: &'a [usize],
    /// Per instruction: its lane buffer ([`super::liveness`]).
    pub(super) slot: &'a [usize],
    /// Per reduction: its reduction slot, and its cascade levels' (columns case).
    pub(super) part: &'a [usize],
    pub(super) eval_start: &'a [usize],
    pub(super) eval: &'a [usize],
    pub(super) acc_start: &'a [usize],
    pub(super) acc: &'a [usize],
    pub(super) stage_start: &'a [usize],
    pub(super) stage: &'a [usize],
    pub(super) axis: &'a [usize],
    pub(super) t_axes: &'a [usize],
    pub(super) o_axes: &'a [usize],
    pub(super) k_axes: &'a [usize],
    pub(super) blk: &'a [usize],
    pub(super) step: &'a [usize],
    pub(super) case: Case,
    pub(super) passes: usize,
    pub(super) n_t: usize,
    /// Rows case: runs per row; columns case: terms per output (both: the product of the
    /// reduced axes outside the chunk axes).
    pub(super) n_o: usize,
    pub(super) lanes: usize,
    /// Bytes between consecutive lane buffers.
    pub(super) stride: usize,
    pub(super) numel: usize,
    pub(super) rows: usize,
    pub(super) inputs: &'a [usize],
    pub(super) outputs: &'a [usize],
    /// The scratch region's byte range in the arena.
    pub(super) s0: usize,
    pub(super) s1: usize,
}

/// What a run writes: the loop index, lane buffers, reduction slots, and the arena around the
/// scratch.
pub(super) struct State<'a> {
    pub(super) idx: &'a mut [usize],
    /// Per instruction: where its value for the current chunk is, if not in its lane buffer
    /// (the arena offset of a load read in place).
    pub(super) src: &'a mut [usize],
    pub(super) bufs: &'a mut [u8],
    pub(super) parts: &'a mut [u8],
    /// Columns case: upper cascade levels, `(LEVELS - 1) * lanes` values per reduction in
    /// the order of the pass lists (empty when no reduction takes more than [`FAN`] terms).
    pub(super) levels: &'a mut [u8],
    pub(super) lo: &'a mut [u8],
    pub(super) hi: &'a mut [u8],
}

/// The lane buffers around one instruction's own (which it writes while it reads the others):
/// the bytes before it and after it, by their offsets among all the buffers.
pub(super) struct Others<'b> {
    before: &'b [u8],
    after: &'b [u8],
    /// Where the written buffer's bytes end (`after` starts).
    gap_end: usize,
}

impl<'b> Others<'b> {
    /// All the lane buffers, none being written.
    pub(super) fn all(bufs: &'b [u8]) -> Others<'b> {
        Others {
            before: bufs,
            after: &[],
            gap_end: bufs.len(),
        }
    }

    /// `bytes` bytes at offset `at` among the lane buffers, outside the one being written.
    pub(super) fn get(&self, at: usize, bytes: usize) -> R<&'b [u8]> {
        if at.saturating_add(bytes) <= self.before.len() {
            sub(self.before, at, bytes)
        } else if at >= self.gap_end {
            sub(self.after, at - self.gap_end, bytes)
        } else {
            Err(KernelError::Internal(
                "an operand in the lane buffer being written",
            ))
        }
    }
}

/// Splits the lane buffers into buffer `at..at + stride` (to write) and the others.
pub(super) fn split_buffers(
    bufs: &mut [u8],
    at: usize,
    stride: usize,
) -> R<(Others<'_>, &mut [u8])> {
    let end = at
        .checked_add(stride)
        .filter(|&e| e <= bufs.len())
        .ok_or(KernelError::Internal("lane buffer"))?;
    let (before, rest) = bufs.split_at_mut(at);
    let (own, after) = rest.split_at_mut(stride);
    Ok((
        Others {
            before,
            after,
            gap_end: end,
        },
        own,
    ))
}

/// `&[u8]` or `&mut [u8]`: what [`region`] cuts a buffer from, so that one function serves
/// the reads and the writes.
pub(super) trait Bytes: Sized {
    fn empty() -> Self;
    /// The `len` bytes from `start`.
    fn cut(self, start: usize, len: usize) -> R<Self>;
}

impl Bytes for &[u8] {
    fn empty() -> Self {
        &[]
    }
    fn cut(self, start: usize, len: usize) -> R<Self> {
        sub(self, start, len)
    }
}

impl Bytes for &mut [u8] {
    fn empty() -> Self {
        &mut []
    }
    fn cut(self, start: usize, len: usize) -> R<Self> {
        sub_mut(self, start, len)
    }
}

/// The bytes `[a, a + bytes)` of the arena, outside the scratch region `[s0, s1)`: in `lo`
/// (the arena below the scratch) or `hi` (from `s1` on).
pub(super) fn region<B: Bytes>(lo: B, hi: B, s0: usize, s1: usize, a: usize, bytes: usize) -> R<B> {
    if bytes == 0 {
        return Ok(B::empty());
    }
    let b = a
        .checked_add(bytes)
        .ok_or(KernelError::Internal("buffer range"))?;
    if b <= s0 {
        lo.cut(a, bytes)
    } else if a >= s1 {
        hi.cut(a - s1, bytes)
    } else {
        Err(KernelError::Internal("buffer inside the scratch region"))
    }
}

impl Plan<'_> {
    /// The dtype of instruction `i`'s lanes: its own, f32 for bf16 (see the module docs).
    pub(super) fn dtype(&self, i: usize) -> DType {
        match code_dtype(self.dt[i]) {
            DType::BF16 => DType::F32,
            d => d,
        }
    }

    /// Whether instruction `i`'s value is bf16 (rounded after each op, narrowed on store).
    pub(super) fn bf16(&self, i: usize) -> bool {
        code_dtype(self.dt[i]) == DType::BF16
    }

    /// Whether instruction `j` has one value over every chunk it is read in (then its lane 0
    /// holds it): a constant, or a row-level value while the lanes run along a row.
    pub(super) fn uniform(&self, j: usize) -> bool {
        let f = self.flags[j];
        f & CONST != 0 || (self.case == Case::Rows && f & XFULL == 0)
    }

    /// Sets the chunk axes of `idx` to chunk position `p0`.
    pub(super) fn set_t(&self, idx: &mut [usize], mut p: usize) {
        for &a in self.t_axes.iter().rev() {
            let d = self.k.domain[a].max(1);
            idx[a] = p % d;
            p /= d;
        }
    }

    /// Row-major position of `idx` in the domain.
    pub(super) fn ravel(&self, idx: &[usize]) -> usize {
        idx.iter()
            .zip(&self.k.domain)
            .fold(0usize, |acc, (&i, &d)| acc.wrapping_mul(d).wrapping_add(i))
    }

    /// Row-major position of `idx` among the rows (reduce axes taken as size 1).
    pub(super) fn ravel_row(&self, idx: &[usize]) -> usize {
        let mut acc = 0usize;
        for (d, (&i, &n)) in idx.iter().zip(&self.k.domain).enumerate() {
            if self.axis[d] & AX_RED == 0 {
                acc = acc.wrapping_mul(n).wrapping_add(i);
            }
        }
        acc
    }

    /// Input `n`'s element index at the chunk's outer index (`idx` off the chunk axes).
    pub(super) fn outer_offset(&self, n: usize, idx: &[usize]) -> usize {
        let inp = &self.k.inputs[n];
        let mut base = inp.access.offset;
        for (d, (&s, &i)) in inp.access.strides.iter().zip(idx.iter()).enumerate() {
            if self.axis[d] & AX_T == 0 {
                base = base.wrapping_add(s.wrapping_mul(i));
            }
        }
        base
    }

    /// What chunk position `p` adds to input `n`'s element index.
    pub(super) fn chunk_offset(&self, n: usize, mut p: usize) -> usize {
        let strides = &self.k.inputs[n].access.strides;
        let mut off = 0usize;
        for &a in self.t_axes.iter().rev() {
            let d = self.k.domain[a].max(1);
            off = off.wrapping_add(strides[a].wrapping_mul(p % d));
            p /= d;
        }
        off
    }

    /// Loads `len` elements of input `n` at chunk position `p0` into `out`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn load(
        &self,
        idx: &[usize],
        lo: &[u8],
        hi: &[u8],
        n: usize,
        len: usize,
        p0: usize,
        out: &mut [u8],
    ) -> R {
        let inp = &self.k.inputs[n];
        let sz = inp.dtype.size();
        let src = region(lo, hi, self.s0, self.s1, self.inputs[n], inp.len * sz)?;
        let base = self.outer_offset(n, idx);
        let (blk, step) = (self.blk[n].max(1), self.step[n]);
        let (mut p, mut done) = (p0, 0);
        while done < len {
            // A segment: the positions up to the end of a block that one stride covers.
            let seg = (len - done).min(blk - p % blk);
            let start = base.wrapping_add(self.chunk_offset(n, p));
            gather(
                src,
                sz,
                start,
                step,
                seg,
                sub_mut(out, done * sz, seg * sz)?,
            )?;
            p += seg;
            done += seg;
        }
        Ok(())
    }

    /// The arena offset of input `n`'s `len` elements at chunk position `p0`, if they are
    /// contiguous and aligned, so that the load can be read in place.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn direct(
        &self,
        idx: &[usize],
        lo: &[u8],
        hi: &[u8],
        n: usize,
        len: usize,
        p0: usize,
    ) -> R<Option<usize>> {
        let inp = &self.k.inputs[n];
        let sz = inp.dtype.size();
        let (blk, step) = (self.blk[n].max(1), self.step[n]);
        if len == 0 || (step != 1 && len > 1) || p0 % blk + len > blk {
            return Ok(None);
        }
        let start = self
            .outer_offset(n, idx)
            .wrapping_add(self.chunk_offset(n, p0));
        let src = region(lo, hi, self.s0, self.s1, self.inputs[n], inp.len * sz)?;
        let Some(bytes) = start
            .checked_mul(sz)
            .and_then(|b| sub(src, b, len * sz).ok())
        else {
            return Err(KernelError::Internal("load outside its input"));
        };
        if !(bytes.as_ptr() as usize).is_multiple_of(sz) {
            return Ok(None);
        }
        Ok(Some(self.inputs[n] + start * sz))
    }

    /// The bytes of instruction `j`'s value on `len` lanes: its lane buffer (among `bufs`),
    /// or the input memory a load is read from in place.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn value<'b>(
        &self,
        src: &[usize],
        bufs: &Others<'b>,
        lo: &'b [u8],
        hi: &'b [u8],
        j: usize,
        len: usize,
    ) -> R<&'b [u8]> {
        let bytes = len * self.dtype(j).size();
        match src[j] {
            IN_BUFFER => bufs.get(self.at(j)?, bytes),
            at => region(lo, hi, self.s0, self.s1, at, bytes),
        }
    }

    /// The offset of instruction `i`'s lane buffer among the lane buffers.
    pub(super) fn at(&self, i: usize) -> R<usize> {
        self.slot
            .get(i)
            .and_then(|&s| s.checked_mul(self.stride))
            .ok_or(KernelError::Internal("a value without a lane buffer"))
    }

    /// The offset of reduction `r`'s slot among the reduction slots.
    pub(super) fn part_at(&self, r: usize) -> R<usize> {
        self.part
            .get(r)
            .and_then(|&q| q.checked_mul(SLOT * WORD))
            .ok_or(KernelError::Internal("a reduction without a slot"))
    }

    /// The index along `axis` at `len` chunk positions from `p0`.
    pub(super) fn index<T: Elem>(
        &self,
        idx: &[usize],
        axis: usize,
        len: usize,
        p0: usize,
        o: &mut [u8],
    ) -> R {
        let o = typed_mut::<T>(o)?;
        if self.axis[axis] & AX_T == 0 {
            o.fill(T::from_usize(idx[axis]));
            return Ok(());
        }
        let mut inner = 1usize;
        for &a in self.t_axes.iter().rev() {
            if a == axis {
                break;
            }
            inner = inner.saturating_mul(self.k.domain[a]);
        }
        let d = self.k.domain[axis].max(1);
        let inner = inner.max(1);
        let (mut v, mut c) = ((p0 / inner) % d, p0 % inner);
        for o in o.iter_mut().take(len) {
            *o = T::from_usize(v);
            c += 1;
            if c == inner {
                c = 0;
                v += 1;
                if v == d {
                    v = 0;
                }
            }
        }
        Ok(())
    }

    /// Evaluates instruction `i` at `len` chunk positions from `p0` into its lane buffer.
    pub(super) fn eval(&self, st: &mut State<'_>, i: usize, len: usize, p0: usize) -> R {
        let dt = self.dtype(i);
        let sz = dt.size();
        let (before, own) = split_buffers(st.bufs, self.at(i)?, self.stride)?;
        let out = sub_mut(own, 0, len * sz)?;
        if let Inst::Load { input } = self.k.body[i] {
            if self.k.inputs[input].dtype == DType::BF16 {
                st.src[i] = IN_BUFFER;
                self.load(st.idx, st.lo, st.hi, input, len, p0, out)?;
                return widen_bf16(out, len);
            }
            if self.flags[i] & DIRECT != 0 {
                if let Some(at) = self.direct(st.idx, st.lo, st.hi, input, len, p0)? {
                    st.src[i] = at;
                    return Ok(());
                }
            }
            st.src[i] = IN_BUFFER;
            return self.load(st.idx, st.lo, st.hi, input, len, p0, out);
        }
        let (src, lo, hi) = (&*st.src, &*st.lo, &*st.hi);
        let arg = |j: usize| self.value(src, &before, lo, hi, j, len);
        let rounds = self.bf16(i)
            && matches!(
                self.k.body[i],
                Inst::Index { .. } | Inst::Unary { .. } | Inst::Binary { .. }
            );
        match self.k.body[i] {
            Inst::Load { .. } => Err(KernelError::Internal("load")),
            // The constant's own dtype: a bf16 one fills its lanes with the rounded f32.
            Inst::Const { value, dtype } => fill_const(dtype, value, out),
            Inst::Index { axis, .. } => by_elem!(dt, index_into(self, st.idx, axis, len, p0, out)),
            Inst::Unary { op, x } => {
                let a = arg(x)?;
                match dt {
                    DType::F32 => unary_float::<f32>(op, a, out),
                    DType::F64 => unary_float::<f64>(op, a, out),
                    DType::I32 => unary::<i32>(op, a, out),
                    DType::I64 => unary::<i64>(op, a, out),
                    DType::Bool => Err(KernelError::Internal("unary op on bool")),
                    DType::BF16 => Err(KernelError::Internal("bf16 lanes are f32")),
                }
            }
            Inst::Binary { op, a, b } => {
                let operand = |j: usize| -> R<Arg<'_>> {
                    Ok(if self.uniform(j) {
                        Arg::Uniform(before.get(self.at(j)?, self.dtype(j).size())?)
                    } else {
                        Arg::Lanes(arg(j)?)
                    })
                };
                let (a, b) = (operand(a)?, operand(b)?);
                match dt {
                    DType::F32 => binary_float::<f32>(op, a, b, out),
                    DType::F64 => binary_float::<f64>(op, a, b, out),
                    DType::I32 => binary::<i32>(op, a, b, out),
                    DType::I64 => binary::<i64>(op, a, b, out),
                    DType::Bool => Err(KernelError::Internal("binary op on bool")),
                    DType::BF16 => Err(KernelError::Internal("bf16 lanes are f32")),
                }
            }
            Inst::Compare { op, a, b } => {
                let t = self.dtype(a);
                let (a, b) = (arg(a)?, arg(b)?);
                by_elem!(t, compare(op, a, b, out))
            }
            Inst::Select { cond, a, b } => {
                let (c, a, b) = (arg(cond)?, arg(a)?, arg(b)?);
                match sz {
                    1 => select::<u8>(c, a, b, out),
                    4 => select::<u32>(c, a, b, out),
                    _ => select::<u64>(c, a, b, out),
                }
            }
            Inst::Convert { x, to } => {
                let from = self.dtype(x);
                let a = arg(x)?;
                by_elem!(from, convert(to, a, out))
            }
            Inst::Reduce { x, .. } => {
                if self.case != Case::Flat {
                    return Err(KernelError::Internal("reduction evaluated in a pass"));
                }
                // Every reduce axis has size 1: the reduction is its operand.
                out.copy_from_slice(arg(x)?);
                Ok(())
            }
        }?;
        if rounds {
            quantize_lanes(out)?;
        }
        Ok(())
    }

    pub(super) fn eval_pass(&self, st: &mut State<'_>, p: usize, len: usize, p0: usize) -> R {
        for &i in list(self.eval_start, self.eval, p) {
            self.eval(st, i, len, p0)?;
        }
        Ok(())
    }

    /// Row-level instructions of stage `s` at `len` positions; in the rows case, finishes the
    /// stage's reductions and broadcasts values to `w` lanes.
    pub(super) fn stage(&self, st: &mut State<'_>, s: usize, len: usize, p0: usize, w: usize) -> R {
        for &i in list(self.stage_start, self.stage, s) {
            let sz = self.dtype(i).size();
            if let Inst::Reduce { .. } = self.k.body[i] {
                if self.case == Case::Rows {
                    let v = sub(st.parts, self.part_at(i)? + 8 * sz, sz)?;
                    let b = sub_mut(st.bufs, self.at(i)?, sz)?;
                    b.copy_from_slice(v);
                    if self.bf16(i) {
                        quantize_lanes(b)?;
                    }
                }
            } else {
                self.eval(st, i, len, p0)?;
            }
            if self.case == Case::Rows && self.flags[i] & BCAST != 0 && w > 1 {
                let b = sub_mut(st.bufs, self.at(i)?, w * sz)?;
                let (first, rest) = b.split_at_mut(sz);
                fill_bytes(first, rest)?;
            }
        }
        Ok(())
    }

    /// Reduction slots (rows case), see [`SlotStep`]; `run` is the run's index in its row.
    pub(super) fn slots(&self, st: &mut State<'_>, p: usize, what: SlotStep, run: usize) -> R {
        let runs = Runs {
            multi: !self.o_axes.is_empty(),
            index: run,
            count: self.n_o,
            len: self.n_t,
        };
        for &r in list(self.acc_start, self.acc, p) {
            let Inst::Reduce { op, .. } = self.k.body[r] else {
                return Err(KernelError::Internal("not a reduction"));
            };
            let dt = self.dtype(r);
            let slot = sub_mut(st.parts, self.part_at(r)?, SLOT * dt.size())?;
            by_num!(dt, slot_op(op, slot, what, runs))?;
        }
        Ok(())
    }

    /// Columns case: the upper cascade levels of reduction slot `c`, on `len` lanes (empty
    /// when the kernel has none).
    pub(super) fn levels<'m>(
        &self,
        levels: &'m mut [u8],
        c: usize,
        len: usize,
        sz: usize,
    ) -> R<&'m mut [u8]> {
        if levels.is_empty() {
            return Ok(&mut []);
        }
        let per = (LEVELS - 1) * self.lanes * WORD;
        sub_mut(levels, c * per, (LEVELS - 1) * len * sz)
    }

    /// The pass's reductions with their reduction slot.
    pub(super) fn reductions(&self, p: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        list(self.acc_start, self.acc, p)
            .iter()
            .map(move |&r| (self.part.get(r).copied().unwrap_or(usize::MAX), r))
    }

    /// Accumulates the pass's reductions over the chunk's `len` lanes: at position `p0` of run
    /// `term` of the row (rows case), or as term `term` of every lane (columns case).
    pub(super) fn accumulate(
        &self,
        st: &mut State<'_>,
        p: usize,
        len: usize,
        p0: usize,
        term: usize,
    ) -> R {
        for (c, r) in self.reductions(p) {
            let Inst::Reduce { op, x } = self.k.body[r] else {
                return Err(KernelError::Internal("not a reduction"));
            };
            let dt = self.dtype(r);
            let sz = dt.size();
            if self.case == Case::Rows {
                let xs = self.value(st.src, &Others::all(st.bufs), st.lo, st.hi, x, len)?;
                let slot = sub_mut(st.parts, self.part_at(r)?, SLOT * sz)?;
                let first = term * self.n_t.div_ceil(RUN_BLOCK);
                by_num!(dt, acc_run(op, xs, slot, p0, first))?;
            } else {
                let (others, own) = split_buffers(st.bufs, self.at(r)?, self.stride)?;
                let xs = self.value(st.src, &others, st.lo, st.hi, x, len)?;
                let acc = sub_mut(own, 0, len * sz)?;
                let upper = self.levels(st.levels, c, len, sz)?;
                by_num!(dt, acc_lanes(op, xs, acc, upper, term))?;
            }
        }
        Ok(())
    }

    /// Columns case: the pass's reductions start at the identity on `len` lanes.
    pub(super) fn init_lanes(&self, st: &mut State<'_>, p: usize, len: usize) -> R {
        for (c, r) in self.reductions(p) {
            let Inst::Reduce { op, .. } = self.k.body[r] else {
                return Err(KernelError::Internal("not a reduction"));
            };
            let dt = self.dtype(r);
            let b = sub_mut(st.bufs, self.at(r)?, len * dt.size())?;
            by_num!(dt, fill_identity(op, b))?;
            self.levels(st.levels, c, len, dt.size())?.fill(0);
        }
        Ok(())
    }

    /// Columns case: the pass's sums of `n_o` terms collect their cascade levels into their
    /// lane buffers.
    pub(super) fn finish_lanes(&self, st: &mut State<'_>, p: usize, len: usize) -> R {
        if st.levels.is_empty() {
            return Ok(());
        }
        for (c, r) in self.reductions(p) {
            let Inst::Reduce { op, .. } = self.k.body[r] else {
                return Err(KernelError::Internal("not a reduction"));
            };
            if op != ReduceOp::Sum {
                continue;
            }
            let dt = self.dtype(r);
            let sz = dt.size();
            let acc = sub_mut(st.bufs, self.at(r)?, len * sz)?;
            let upper = self.levels(st.levels, c, len, sz)?;
            by_num!(dt, finish_cascade_lanes(acc, upper, self.n_o))?;
        }
        Ok(())
    }

    /// Columns case: the pass's bf16 reductions, finished, round their lanes once.
    pub(super) fn round_lanes(&self, st: &mut State<'_>, p: usize, len: usize) -> R {
        for (_, r) in self.reductions(p) {
            if self.bf16(r) {
                quantize_lanes(sub_mut(st.bufs, self.at(r)?, len * 4)?)?;
            }
        }
        Ok(())
    }

    /// Stores `len` lanes of every output for which `full` matches, at element `elem`.
    pub(super) fn store(&self, st: &mut State<'_>, full: bool, elem: usize, len: usize) -> R {
        for (j, out) in self.k.outputs.iter().enumerate() {
            let v = out.value;
            let is_full = self.flags[v] & XFULL != 0;
            if is_full != full {
                continue;
            }
            let sz = self.dtype(v).size();
            let n = if self.flags[v] & ROW != 0 {
                self.rows
            } else {
                self.numel
            };
            let src = sub(st.bufs, self.at(v)?, len * sz)?;
            let (s0, s1, at) = (self.s0, self.s1, self.outputs[j]);
            if self.bf16(v) {
                // The lanes are rounded already: narrowing is exact.
                let dst = region(&mut *st.lo, &mut *st.hi, s0, s1, at, n * 2)?;
                let dst = sub_mut(dst, elem * 2, len * 2)?;
                for (d, x) in dst.chunks_exact_mut(2).zip(typed::<f32>(src)?) {
                    d.copy_from_slice(&half::bf16::from_f32(*x).to_bits().to_ne_bytes());
                }
                continue;
            }
            let dst = region(&mut *st.lo, &mut *st.hi, s0, s1, at, n * sz)?;
            sub_mut(dst, elem * sz, len * sz)?.copy_from_slice(src);
        }
        Ok(())
    }

    pub(super) fn run_flat(&self, st: &mut State<'_>) -> R {
        // The scratch holding `idx` is not cleared between runs: axes off the chunk (size 1)
        // must read 0, not what the last kernel left there.
        st.idx.fill(0);
        let mut p0 = 0;
        while p0 < self.n_t {
            let len = self.lanes.min(self.n_t - p0);
            self.eval_pass(st, 0, len, p0)?;
            self.store(st, true, p0, len)?;
            p0 += len;
        }
        Ok(())
    }

    pub(super) fn run_rows(&self, st: &mut State<'_>) -> R {
        let dims = &self.k.domain;
        if self.k_axes.iter().any(|&a| dims[a] == 0) {
            return Ok(());
        }
        let o_empty = self.o_axes.iter().any(|&a| dims[a] == 0);
        let w = self.lanes.min(self.n_t);
        st.idx.fill(0);
        loop {
            self.stage(st, 0, 1, 0, w)?;
            for p in 0..self.passes {
                let last = p + 1 == self.passes;
                self.slots(st, p, SlotStep::StartRow, 0)?;
                if !o_empty {
                    for &a in self.o_axes {
                        st.idx[a] = 0;
                    }
                    let mut run = 0;
                    loop {
                        self.slots(st, p, SlotStep::StartRun, run)?;
                        let mut p0 = 0;
                        while p0 < self.n_t {
                            let len = self.lanes.min(self.n_t - p0);
                            self.set_t(st.idx, p0);
                            self.eval_pass(st, p, len, p0)?;
                            self.accumulate(st, p, len, p0, run)?;
                            if last {
                                let e = self.ravel(st.idx);
                                self.store(st, true, e, len)?;
                            }
                            p0 += len;
                        }
                        self.slots(st, p, SlotStep::EndRun, run)?;
                        run += 1;
                        if !next(st.idx, self.o_axes, dims) {
                            break;
                        }
                    }
                    self.slots(st, p, SlotStep::EndRow, run)?;
                }
                self.stage(st, p + 1, 1, 0, w)?;
            }
            let e = self.ravel_row(st.idx);
            self.store(st, false, e, 1)?;
            if !next(st.idx, self.k_axes, dims) {
                return Ok(());
            }
        }
    }

    pub(super) fn run_columns(&self, st: &mut State<'_>) -> R {
        let dims = &self.k.domain;
        if self.k_axes.iter().any(|&a| dims[a] == 0) || self.n_t == 0 {
            return Ok(());
        }
        let o_empty = self.o_axes.iter().any(|&a| dims[a] == 0);
        st.idx.fill(0);
        loop {
            let mut p0 = 0;
            while p0 < self.n_t {
                let len = self.lanes.min(self.n_t - p0);
                self.set_t(st.idx, p0);
                self.stage(st, 0, len, p0, 0)?;
                for p in 0..self.passes {
                    let last = p + 1 == self.passes;
                    self.init_lanes(st, p, len)?;
                    if !o_empty {
                        for &a in self.o_axes {
                            st.idx[a] = 0;
                        }
                        let mut term = 0;
                        loop {
                            self.eval_pass(st, p, len, p0)?;
                            self.accumulate(st, p, len, p0, term)?;
                            term += 1;
                            if last {
                                let e = self.ravel(st.idx);
                                self.store(st, true, e, len)?;
                            }
                            if !next(st.idx, self.o_axes, dims) {
                                break;
                            }
                        }
                        self.finish_lanes(st, p, len)?;
                    }
                    self.round_lanes(st, p, len)?;
                    self.stage(st, p + 1, len, p0, 0)?;
                }
                let e = self.ravel_row(st.idx);
                self.store(st, false, e, len)?;
                p0 += len;
            }
            if !next(st.idx, self.k_axes, dims) {
                return Ok(());
            }
        }
    }
}

pub(super) fn index_into<T: Elem>(
    pl: &Plan<'_>,
    idx: &[usize],
    axis: usize,
    len: usize,
    p0: usize,
    o: &mut [u8],
) -> R {
    pl.index::<T>(idx, axis, len, p0, o)
}

/// Advances the row-major odometer over `axes` of `idx`; false when it wraps around.
pub(super) fn next(idx: &mut [usize], axes: &[usize], dims: &[usize]) -> bool {
    for &a in axes.iter().rev() {
        idx[a] += 1;
        if idx[a] < dims[a] {
            return true;
        }
        idx[a] = 0;
    }
    false
}
