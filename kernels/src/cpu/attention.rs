//! Fused attention on the CPU: the reference implementation of the IR's `attention` and
//! `attention_grad` ops, with the semantics the CUDA kernels (`crate::cuda::attention`) share.
//!
//! For each of `batch_heads` independent problems, with `q [seq_q, head_dim]`, `k` and
//! `v [seq_k, head_dim]` (rows where the shape's [`Layout`] puts them) and key `j` visible to
//! query `i` unless `causal` and `j > i`:
//! - forward: `s_ij = scale · q_i·k_j`, `m_i = max_j s_ij`, `l_i = Σ_j exp(s_ij − m_i)`,
//!   `p_ij = exp(s_ij − m_i) / l_i`, `out_i = Σ_j p_ij v_j`, and `lse_i = m_i + ln l_i`;
//! - backward, from `lse` and `out`: `p_ij = exp(s_ij − lse_i)`, `delta_i = Σ_d dout_id·out_id`,
//!   `dp_ij = dout_i·v_j`, `ds_ij = p_ij (dp_ij − delta_i)`; `dv_j = Σ_i p_ij dout_i`,
//!   `dq_i = scale Σ_j ds_ij k_j`, `dk_j = scale Σ_i ds_ij q_i`.
//!
//! Arithmetic is f32, the exponentials [`exp_f32`]'s (branch-free, within 1 ulp, so that a row's
//! run of them vectorises; the CUDA kernels use CUDA's). bf16 operands are widened exactly; as in the bf16 tensor-core kernels,
//! the probabilities (and in the backward pass `ds`) are rounded to bf16 before they enter a
//! product with a bf16 operand, and every bf16 output is rounded once, to nearest even, when
//! stored. Sums run in index order (keys for a row, queries for a key), so results are
//! deterministic.
//!
//! Scratch (f32 elements, [`forward_scratch_len`], [`backward_scratch_len`]) comes from the
//! caller: the runtime plans it in the slab, so a step allocates nothing.
//!
//! Inside a rayon pool of several threads (the CPU executor's), the problems are spread over the
//! threads, each range of problems with its scratch on its thread's stack; every problem is
//! computed exactly as on one thread, so the bits do not depend on the number of threads.
//!
//! # Speed: the keys transposed
//! A score `q_i·k_j` summed along the head dimension, one product after another, is a chain
//! of dependent additions: on the README's main job (head_dim 16) attention spent most of its
//! time waiting on them. When a problem's transposed keys (and, backward, values) fit beside
//! its scratch in `STACK_SCRATCH`, they are copied once per problem as f32 columns, and the
//! scores of a row are computed for all its keys at once, each key in its own lane
//! (`dots_transposed`): every score is still summed over `c = 0, 1, …` from `0.0`, so the
//! bits are those of the one-key-at-a-time `dot`, which larger problems still use.
//!
//! # Speed: wide vectors
//! Each task's problems are compiled for the widest vectors the CPU has ([`super::wide`]:
//! AVX-512 or AVX2 where the build's baseline is SSE2), which changes no bit: the tests compare
//! them with one key at a time on the baseline's vectors.
//!
//! A slice too short for its layout is a broken precondition and panics with a message; the
//! runtime checks shapes before it calls in.

use super::exp::exp_f32;
use super::par::pool_threads;
use super::wide::{self, Level, Wide};
use crate::attention::{Layout, Strides};
use crate::dtype::round_bf16;
use half::bf16;

/// One attention problem set (the CPU's twin of `cuda::attention::AttentionShape`, without
/// the precision: the element type decides it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub batch_heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub scale: f32,
    /// Where each operand's rows lie (`Layout::contiguous` for `[batch_heads, seq, head_dim]`).
    pub layout: Layout,
}

impl Shape {
    /// `batch_heads` problems of `seq_q` queries over `seq_k` keys of `head_dim` elements,
    /// scaled by `scale`, laid out as `layout`.
    pub fn new(
        (batch_heads, seq_q, seq_k, head_dim, causal): (usize, usize, usize, usize, bool),
        scale: f32,
        layout: Layout,
    ) -> Shape {
        Shape {
            batch_heads,
            seq_q,
            seq_k,
            head_dim,
            causal,
            scale,
            layout,
        }
    }

    /// The rows of problem `b` of an operand laid out by `st`.
    fn rows<'a, T>(&self, x: &'a [T], st: &Strides, b: usize) -> Rows<'a, T> {
        Rows {
            x,
            base: st.offset(self.layout.heads, b, 0),
            step: st.row,
            len: self.head_dim,
        }
    }

    /// Checks that an operand laid out by `st` with `seq` rows a problem fits in `len`.
    fn check(&self, what: &str, len: usize, st: &Strides, seq: usize) {
        let want = st.extent(self.layout.heads, self.batch_heads, seq, self.head_dim);
        assert!(
            len >= want,
            "attention: {what} has {len} elements, its layout reaches {want}"
        );
    }

    /// Keys visible to query `i`: `0..visible(i)`.
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            (i + 1).min(self.seq_k)
        } else {
            self.seq_k
        }
    }
}

/// The rows of one problem of one operand: where its row 0 starts, found once per problem
/// ([`Strides::offset`] divides by the head count), and the step from one row to the next, so
/// that reading a row inside the loops costs a multiply-add (`Strides::offset(b, i)` is
/// `offset(b, 0) + i · row` for every layout).
#[derive(Clone, Copy)]
struct Rows<'a, T> {
    x: &'a [T],
    base: usize,
    step: usize,
    len: usize,
}

impl<'a, T> Rows<'a, T> {
    /// Row `i`.
    #[inline(always)]
    fn get(&self, i: usize) -> &'a [T] {
        &self.x[self.base + i * self.step..][..self.len]
    }
}

/// An element type attention runs on: f32 or bf16.
pub trait Elem: Copy + Send + Sync + 'static {
    /// Products with a probability round it to this type first (bf16 does).
    const ROUNDS: bool;
    fn get(self) -> f32;
    /// The stored value of `x` (rounded once for bf16).
    fn put(x: f32) -> Self;
}

impl Elem for f32 {
    const ROUNDS: bool = false;
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }
    #[inline(always)]
    fn put(x: f32) -> f32 {
        x
    }
}

impl Elem for bf16 {
    const ROUNDS: bool = true;
    #[inline(always)]
    fn get(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn put(x: f32) -> bf16 {
        round_bf16(x)
    }
}

/// `x` as a product with `T` operands sees it.
#[inline(always)]
fn operand<T: Elem>(x: f32) -> f32 {
    if T::ROUNDS {
        round_bf16(x).to_f32()
    } else {
        x
    }
}

/// f32 scratch elements [`forward`] needs: one row of scores and one output row.
pub fn forward_scratch_len(s: &Shape) -> usize {
    s.seq_k + s.head_dim
}

/// f32 scratch elements [`backward`] needs: f32 accumulators of `dk` and `dv` for one problem,
/// a row of probabilities, a row of `ds` and a `dq` row.
pub fn backward_scratch_len(s: &Shape) -> usize {
    2 * s.seq_k * s.head_dim + 2 * s.seq_k + s.head_dim
}

#[inline(always)]
fn dot<T: Elem>(a: &[T], b: &[T]) -> f32 {
    a.iter()
        .zip(b)
        .fold(0.0f32, |acc, (x, y)| acc + x.get() * y.get())
}

/// Rows `0..seq` of one problem's `x`, widened to f32 and transposed:
/// `t[c·seq + j] = x_jc`.
#[inline(always)]
fn transpose_rows<T: Elem>(x: Rows<'_, T>, seq: usize, t: &mut [f32]) {
    for j in 0..seq {
        for (c, e) in x.get(j).iter().enumerate() {
            t[c * seq + j] = e.get();
        }
    }
}

/// `out[j] = dot(x, row j)` for `j < out.len()`, from the rows transposed by
/// [`transpose_rows`] into `t` (`seq` of them): the same sums as [`dot`] (from `0.0`, over
/// `c` in order, `x_c · row_jc` each), so the same bits, but with the keys in the lanes of
/// one vectorised loop instead of one chain of additions per key. Blocks of [`KEYS`] keys
/// keep their sums in registers across the whole head dimension; the rest are summed in
/// `out` itself, a pass over them per `c`.
#[inline(always)]
fn dots_transposed<T: Elem>(x: &[T], t: &[f32], seq: usize, out: &mut [f32]) {
    let n = out.len();
    let blocked = n / KEYS * KEYS;
    for j0 in (0..blocked).step_by(KEYS) {
        let mut acc = [0.0f32; KEYS];
        for (c, xc) in x.iter().enumerate() {
            let xc = xc.get();
            let tc = &t[c * seq + j0..][..KEYS];
            for (a, &tv) in acc.iter_mut().zip(tc) {
                *a += xc * tv;
            }
        }
        out[j0..j0 + KEYS].copy_from_slice(&acc);
    }
    let rest = &mut out[blocked..];
    rest.fill(0.0);
    for (c, xc) in x.iter().enumerate() {
        let xc = xc.get();
        for (o, &tv) in rest.iter_mut().zip(&t[c * seq + blocked..][..n - blocked]) {
            *o += xc * tv;
        }
    }
}

/// Keys whose scores [`dots_transposed`] keeps in registers at once: four AVX-512 vectors.
const KEYS: usize = 64;

fn check_len(what: &str, got: usize, want: usize) {
    assert!(
        got == want,
        "attention: {what} has {got} elements, the shape needs {want}"
    );
}

/// The forward pass: `out` and `lse` from `q`, `k`, `v` (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn forward<T: Elem>(
    s: &Shape,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
    lse: &mut [f32],
    scratch: &mut [f32],
) {
    let (bh, tq, tk) = (s.batch_heads, s.seq_q, s.seq_k);
    let l = s.layout;
    s.check("q", q.len(), &l.q, tq);
    s.check("k", k.len(), &l.kv, tk);
    s.check("v", v.len(), &l.kv, tk);
    s.check("out", out.len(), &l.out, tq);
    check_len("lse", lse.len(), bh * tq);
    assert!(
        scratch.len() >= forward_scratch_len(s),
        "attention: the scratch has {} f32 elements, the forward pass needs {}",
        scratch.len(),
        forward_scratch_len(s)
    );
    forward_with(s, [q, k, v], out, lse, scratch, Speed::Best);
}

/// How the scores are summed: [`Speed::Best`] transposes the keys when they fit
/// ([`dots_transposed`]), on the widest vectors; [`Speed::Plain`] always sums one key at a
/// time ([`dot`]), the path of problems too large for the stack, on the baseline's vectors
/// (the tests compare the two).
#[derive(Clone, Copy, PartialEq)]
enum Speed {
    Best,
    #[cfg_attr(not(test), allow(dead_code))]
    Plain,
}

/// [`forward`], its checks done, by `speed`.
fn forward_with<T: Elem>(
    s: &Shape,
    [q, k, v]: [&[T]; 3],
    out: &mut [T],
    lse: &mut [f32],
    scratch: &mut [f32],
    speed: Speed,
) {
    let (bh, tq, tk, d) = (s.batch_heads, s.seq_q, s.seq_k, s.head_dim);
    let pass = Forward {
        s,
        qkv: [q, k, v],
        out: Out(out.as_mut_ptr()),
        lse: Out(lse.as_mut_ptr()),
    };
    let need = forward_scratch_len(s);
    by_problem(
        bh,
        tq * tk * d,
        [need, need + tk * d],
        speed,
        scratch,
        &pass,
    );
}

/// The forward pass's problems, its outputs written through raw pointers (each problem its
/// own rows).
struct Forward<'a, T> {
    s: &'a Shape,
    qkv: [&'a [T]; 3],
    out: Out<T>,
    lse: Out<f32>,
}

impl<T: Elem> Problems for Forward<'_, T> {
    /// One problem, with `scratch` for its row of scores and its output row, then (when
    /// `fast`) its keys transposed.
    #[inline(always)]
    fn one(&self, b: usize, scratch: &mut [f32], fast: bool) {
        let (s, [q, k, v]) = (self.s, self.qkv);
        let (out_p, lse_p) = (self.out, self.lse);
        let (tq, tk, d) = (s.seq_q, s.seq_k, s.head_dim);
        let l = s.layout;
        let (row, rest) = scratch.split_at_mut(tk);
        let (acc, kt) = rest.split_at_mut(d);
        let (qb, kb, vb) = (s.rows(q, &l.q, b), s.rows(k, &l.kv, b), s.rows(v, &l.kv, b));
        let out_b = l.out.offset(l.heads, b, 0);
        if fast {
            transpose_rows(kb, tk, &mut kt[..tk * d]);
        }
        for i in 0..tq {
            let n = s.visible(i);
            let qi = qb.get(i);
            let mut m = f32::NEG_INFINITY;
            if fast {
                dots_transposed(qi, kt, tk, &mut row[..n]);
                for r in &mut row[..n] {
                    *r *= s.scale;
                    m = m.max(*r);
                }
            } else {
                for (j, r) in row[..n].iter_mut().enumerate() {
                    let x = dot(qi, kb.get(j)) * s.scale;
                    *r = x;
                    m = m.max(x);
                }
            }
            // The exponentials in one vectorised loop, then their sum in index order.
            for x in &mut row[..n] {
                *x = exp_f32(*x - m);
            }
            let sum = row[..n].iter().fold(0.0f32, |a, &x| a + x);
            acc.fill(0.0);
            for (j, &r) in row[..n].iter().enumerate() {
                let p = operand::<T>(r / sum);
                for (a, vj) in acc.iter_mut().zip(vb.get(j)) {
                    *a += p * vj.get();
                }
            }
            // SAFETY: the row lies inside `out` (checked above: the layout's extent fits) and
            // belongs to problem `b` alone, so no other call writes it; likewise lse's element.
            let o = unsafe { out_p.rows(out_b + i * l.out.row, d) };
            for (o, a) in o.iter_mut().zip(acc.iter()) {
                *o = T::put(*a);
            }
            // SAFETY: `b·tq + i < bh·tq = lse.len()` (checked), written by problem `b` only.
            unsafe { *lse_p.rows(b * tq + i, 1).as_mut_ptr() = m + sum.ln() };
        }
    }
}

/// A raw output pointer that problems running on different threads write through, each its
/// own rows (the callers vouch for that at every use).
#[derive(Clone, Copy)]
struct Out<T>(*mut T);
// SAFETY: used only to write rows that belong to one problem each (see `by_problem`).
unsafe impl<T> Send for Out<T> {}
// SAFETY: as for Send.
unsafe impl<T> Sync for Out<T> {}
impl<T> Out<T> {
    /// `len` elements from element `at`.
    ///
    /// # Safety
    /// They lie inside the buffer and no other live reference covers them.
    #[allow(clippy::mut_from_ref)]
    unsafe fn rows(&self, at: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(at), len)
    }
}

/// Problems whose f32 scratch is at most this long run on several threads, each task with its
/// scratch on its stack (512 KiB: the backward pass of gpt-mini's heads, 256 keys of 64, needs
/// 66,112 with its keys and values transposed, and ran one key at a time when this was 256 KiB);
/// longer ones run one after another in the planned scratch.
const STACK_SCRATCH: usize = 1 << 17;
/// Multiply-adds per problem times problems below which a pass stays on one thread.
const PARALLEL_WORK: usize = 1 << 18;

/// The problems of one pass: `one(b, scratch, fast)` computes problem `b` with `scratch` (the
/// transposed operands' room too when `fast`). Implementations mark `one` `#[inline(always)]`,
/// so that [`Tasks`] compiles it for the widest vectors ([`super::wide`]).
trait Problems: Sync {
    fn one(&self, b: usize, scratch: &mut [f32], fast: bool);
}

/// Problems `range` of a pass, one after another in `scratch`: a job for [`wide::at`].
struct Tasks<'a, P> {
    pass: &'a P,
    range: std::ops::Range<usize>,
    scratch: &'a mut [f32],
    fast: bool,
}

impl<P: Problems> Wide for Tasks<'_, P> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        for b in self.range {
            self.pass.one(b, self.scratch, self.fast);
        }
    }
}

/// Runs `pass.one(b, scratch, fast)` for every problem `b < bh`. `need` is the f32 scratch of a
/// problem without and with its transposed operands; `fast` says the scratch has room for
/// them, which it has whenever they fit in [`STACK_SCRATCH`] (and `speed` allows). Inside a
/// pool of several threads and with enough work, the problems are spread over the pool in
/// contiguous ranges, each with its own scratch on its thread's stack; otherwise they run on
/// the calling thread, with stack scratch when fast, else in the `planned` scratch. Each
/// problem computes the same bits wherever it runs (problems share no sums), and fast or not
/// (see [`dots_transposed`]), and at every vector width ([`super::wide`]).
fn by_problem<P: Problems>(
    bh: usize,
    work: usize,
    [plain, with_transposed]: [usize; 2],
    speed: Speed,
    planned: &mut [f32],
    pass: &P,
) {
    let level = match speed {
        Speed::Best => wide::level(),
        Speed::Plain => Level::Base,
    };
    let run = |range: std::ops::Range<usize>, scratch: &mut [f32], fast: bool| {
        wide::at(
            level,
            Tasks {
                pass,
                range,
                scratch,
                fast,
            },
        )
    };
    let fast = speed == Speed::Best && with_transposed <= STACK_SCRATCH;
    let need = if fast { with_transposed } else { plain };
    let threads = pool_threads();
    if threads > 1 && bh > 1 && need <= STACK_SCRATCH && bh.saturating_mul(work) >= PARALLEL_WORK {
        use rayon::prelude::*;
        let tasks = bh.min(threads * 4);
        (0..tasks).into_par_iter().for_each(|t| {
            let mut scratch = [0.0f32; STACK_SCRATCH];
            run(
                bh * t / tasks..bh * (t + 1) / tasks,
                &mut scratch[..need],
                fast,
            );
        });
    } else if fast {
        let mut scratch = [0.0f32; STACK_SCRATCH];
        run(0..bh, &mut scratch[..need], true);
    } else {
        run(0..bh, planned, false);
    }
}

/// Where the backward pass writes `dq`, `dk` and `dv`: three buffers, or the slots of one
/// (a packed layout), each slot's start given in elements.
pub enum Grads<'a, T> {
    Separate {
        dq: &'a mut [T],
        dk: &'a mut [T],
        dv: &'a mut [T],
    },
    Packed {
        dqkv: &'a mut [T],
        starts: [usize; 3],
    },
}

impl<T> Grads<'_, T> {
    /// Gradient `which` (0 dq, 1 dk, 2 dv): its buffer, from where it starts.
    fn slot(&mut self, which: usize) -> &mut [T] {
        match self {
            Grads::Separate { dq, dk, dv } => match which {
                0 => dq,
                1 => dk,
                _ => dv,
            },
            Grads::Packed { dqkv, starts } => &mut dqkv[starts[which]..],
        }
    }
}

/// The backward pass: `dq`, `dk`, `dv` from `q`, `k`, `v`, the forward's `out` and `lse`, and
/// the output's gradient `dout` (see the module docs). Every output is written, not added to.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Elem>(
    s: &Shape,
    [q, k, v, out, dout]: [&[T]; 5],
    lse: &[f32],
    mut grads: Grads<'_, T>,
    scratch: &mut [f32],
) {
    let (bh, tq, tk) = (s.batch_heads, s.seq_q, s.seq_k);
    let l = s.layout;
    for (what, len, st, seq) in [
        ("q", q.len(), &l.q, tq),
        ("k", k.len(), &l.kv, tk),
        ("v", v.len(), &l.kv, tk),
        ("out", out.len(), &l.out, tq),
        ("dout", dout.len(), &l.out, tq),
    ] {
        s.check(what, len, st, seq);
    }
    check_len("lse", lse.len(), bh * tq);
    for (what, which, st, seq) in [
        ("dq", 0, &l.q, tq),
        ("dk", 1, &l.kv, tk),
        ("dv", 2, &l.kv, tk),
    ] {
        s.check(what, grads.slot(which).len(), st, seq);
    }
    assert!(
        scratch.len() >= backward_scratch_len(s),
        "attention: the scratch has {} f32 elements, the backward pass needs {}",
        scratch.len(),
        backward_scratch_len(s)
    );
    backward_with(s, [q, k, v, out, dout], lse, grads, scratch, Speed::Best);
}

/// [`backward`], its checks done, by `speed`.
fn backward_with<T: Elem>(
    s: &Shape,
    [q, k, v, out, dout]: [&[T]; 5],
    lse: &[f32],
    mut grads: Grads<'_, T>,
    scratch: &mut [f32],
    speed: Speed,
) {
    let (bh, tq, tk, d) = (s.batch_heads, s.seq_q, s.seq_k, s.head_dim);
    let mut slot = |which: usize| Out(grads.slot(which).as_mut_ptr());
    let pass = Backward {
        s,
        operands: [q, k, v, out, dout],
        lse,
        grads: [slot(0), slot(1), slot(2)],
    };
    let need = backward_scratch_len(s);
    let with_transposed = need + 2 * tk * d;
    by_problem(
        bh,
        tq * tk * d * 3,
        [need, with_transposed],
        speed,
        scratch,
        &pass,
    );
}

/// The backward pass's problems, `dq`, `dk` and `dv` written through raw pointers (each
/// problem its own rows).
struct Backward<'a, T> {
    s: &'a Shape,
    operands: [&'a [T]; 5],
    lse: &'a [f32],
    grads: [Out<T>; 3],
}

impl<T: Elem> Problems for Backward<'_, T> {
    /// One problem, with `scratch` for its f32 accumulators, then (when `fast`) its keys and
    /// values transposed.
    #[inline(always)]
    fn one(&self, b: usize, scratch: &mut [f32], fast: bool) {
        let (s, [q, k, v, out, dout], lse) = (self.s, self.operands, self.lse);
        let [dq_p, dk_p, dv_p] = self.grads;
        let (tq, tk, d) = (s.seq_q, s.seq_k, s.head_dim);
        let l = s.layout;
        let (dk_acc, rest) = scratch.split_at_mut(tk * d);
        let (dv_acc, rest) = rest.split_at_mut(tk * d);
        let (p_row, rest) = rest.split_at_mut(tk);
        let (ds_row, rest) = rest.split_at_mut(tk);
        let (dq_acc, rest) = rest.split_at_mut(d);
        let (kt, vt) = rest.split_at_mut(if fast { tk * d } else { 0 });
        let (qb, kb, vb) = (s.rows(q, &l.q, b), s.rows(k, &l.kv, b), s.rows(v, &l.kv, b));
        let (ob, gb) = (s.rows(out, &l.out, b), s.rows(dout, &l.out, b));
        let (dq_b, dkv_b) = (l.q.offset(l.heads, b, 0), l.kv.offset(l.heads, b, 0));
        if fast {
            transpose_rows(kb, tk, kt);
            transpose_rows(vb, tk, &mut vt[..tk * d]);
        }
        dk_acc.fill(0.0);
        dv_acc.fill(0.0);
        for i in 0..tq {
            let n = s.visible(i);
            let qi = qb.get(i);
            let (oi, gi) = (ob.get(i), gb.get(i));
            let delta = dot(gi, oi);
            let lse_i = lse[b * tq + i];
            if fast {
                // Scores into p_row, dp = dout_i·v_j into ds_row, then both finished in place.
                dots_transposed(qi, kt, tk, &mut p_row[..n]);
                dots_transposed(gi, vt, tk, &mut ds_row[..n]);
                for (p, ds) in p_row[..n].iter_mut().zip(&mut ds_row[..n]) {
                    *p = exp_f32(*p * s.scale - lse_i);
                    *ds = operand::<T>(*p * (*ds - delta));
                }
            } else {
                for j in 0..n {
                    let (kj, vj) = (kb.get(j), vb.get(j));
                    let p = exp_f32(dot(qi, kj) * s.scale - lse_i);
                    p_row[j] = p;
                    ds_row[j] = operand::<T>(p * (dot(gi, vj) - delta));
                }
            }
            dq_acc.fill(0.0);
            let rows = dk_acc.chunks_exact_mut(d).zip(dv_acc.chunks_exact_mut(d));
            for (j, (dk_j, dv_j)) in rows.take(n).enumerate() {
                let (p, ds) = (operand::<T>(p_row[j]), ds_row[j]);
                for (a, x) in dq_acc.iter_mut().zip(kb.get(j)) {
                    *a += ds * x.get();
                }
                for (a, x) in dk_j.iter_mut().zip(qi) {
                    *a += ds * x.get();
                }
                for (a, x) in dv_j.iter_mut().zip(gi) {
                    *a += p * x.get();
                }
            }
            // SAFETY: the row lies inside dq's slot (checked above) and belongs to problem `b`
            // alone; the slots of a packed buffer are disjoint.
            let dq = unsafe { dq_p.rows(dq_b + i * l.q.row, d) };
            for (o, a) in dq.iter_mut().zip(dq_acc.iter()) {
                *o = T::put(*a * s.scale);
            }
        }
        for j in 0..tk {
            let at = dkv_b + j * l.kv.row;
            let acc = [(dk_p, &*dk_acc, s.scale), (dv_p, &*dv_acc, 1.0)];
            for (dst, acc, factor) in acc {
                // SAFETY: as for dq: inside the slot (checked), problem `b`'s row alone.
                let dst = unsafe { dst.rows(at, d) };
                for (o, a) in dst.iter_mut().zip(&acc[j * d..][..d]) {
                    *o = T::put(*a * factor);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain f64 loops over the definition, with the probabilities computed from the full
    /// softmax (no lse): an independent reference for f32 inputs.
    fn reference(s: &Shape, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
        let (tq, tk, d) = (s.seq_q, s.seq_k, s.head_dim);
        let mut out = vec![0.0; s.batch_heads * tq * d];
        for b in 0..s.batch_heads {
            for i in 0..tq {
                let sc: Vec<f64> = (0..tk)
                    .map(|j| {
                        if s.causal && j > i {
                            f64::NEG_INFINITY
                        } else {
                            (0..d)
                                .map(|c| {
                                    q[(b * tq + i) * d + c] as f64 * k[(b * tk + j) * d + c] as f64
                                })
                                .sum::<f64>()
                                * s.scale as f64
                        }
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                for c in 0..d {
                    out[(b * tq + i) * d + c] = (0..tk)
                        .map(|j| (sc[j] - m).exp() / z * v[(b * tk + j) * d + c] as f64)
                        .sum();
                }
            }
        }
        out
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2654435761).wrapping_add(seed * 97);
                ((x >> 8) % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn the_forward_pass_matches_a_plain_f64_softmax_attention() {
        for causal in [false, true] {
            let s = Shape::new((2, 5, 7, 3, causal), 0.7, Layout::contiguous(5, 7, 3));
            let (q, k, v) = (data(30, 1), data(42, 2), data(42, 3));
            let mut out = vec![0.0; 30];
            let mut lse = vec![0.0; 10];
            let mut scratch = vec![f32::NAN; forward_scratch_len(&s)];
            forward(&s, &q, &k, &v, &mut out, &mut lse, &mut scratch);
            let want = reference(&s, &q, &k, &v);
            for (o, w) in out.iter().zip(&want) {
                assert!((*o as f64 - w).abs() < 1e-5, "{o} vs {w}");
            }
        }
    }

    #[test]
    fn the_backward_pass_matches_central_differences_of_the_forward() {
        let s = Shape::new((1, 4, 4, 3, true), 0.5, Layout::contiguous(4, 4, 3));
        let n = 12;
        let (q, k, v, w) = (data(n, 4), data(n, 5), data(n, 6), data(n, 7));
        // L = Σ w · out, so dout = w.
        let loss = |q: &[f32], k: &[f32], v: &[f32]| -> f64 {
            let r = reference(&s, q, k, v);
            r.iter().zip(&w).map(|(a, b)| a * *b as f64).sum()
        };
        let mut out = vec![0.0; n];
        let mut lse = vec![0.0; 4];
        forward(&s, &q, &k, &v, &mut out, &mut lse, &mut [0.0; 16]);
        let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let mut scratch = vec![f32::NAN; backward_scratch_len(&s)];
        backward(
            &s,
            [&q, &k, &v, &out, &w],
            &lse,
            Grads::Separate {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            },
            &mut scratch,
        );
        let h = 1e-3f32;
        for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
            for e in 0..n {
                let bump = |delta: f32| {
                    let mut x = [q.clone(), k.clone(), v.clone()];
                    x[which][e] += delta;
                    loss(&x[0], &x[1], &x[2])
                };
                let fd = (bump(h) - bump(-h)) / (2.0 * h as f64);
                assert!(
                    (grad[e] as f64 - fd).abs() < 2e-3,
                    "operand {which} element {e}: {} vs {fd}",
                    grad[e]
                );
            }
        }
    }

    #[test]
    fn bf16_outputs_are_the_f32_results_rounded_once_when_p_is_already_a_bf16_value() {
        // One visible key per row (causal, seq 1): p = 1 exactly, so out = v rounded.
        let s = Shape::new((1, 1, 1, 4, true), 1.0, Layout::contiguous(1, 1, 4));
        let v: Vec<bf16> = [0.1f32, -2.5, 3.0, 7.75].map(round_bf16).to_vec();
        let q = v.clone();
        let mut out = vec![bf16::ZERO; 4];
        let mut lse = vec![0.0; 1];
        forward(&s, &q, &q, &v, &mut out, &mut lse, &mut [0.0; 5]);
        assert_eq!(out, v);
        let want: f32 = q.iter().map(|x| x.to_f32() * x.to_f32()).sum();
        assert!((lse[0] - want).abs() < 1e-5);
    }

    /// `x [b, h, t, d]` (contiguous problems) as `[b, t, h, d]`.
    fn to_tokens(x: &[f32], b: usize, h: usize, t: usize, d: usize) -> Vec<f32> {
        let mut y = vec![0.0; x.len()];
        for (bi, hi, ti) in
            (0..b).flat_map(|bi| (0..h).flat_map(move |hi| (0..t).map(move |ti| (bi, hi, ti))))
        {
            let from = ((bi * h + hi) * t + ti) * d;
            let to = ((bi * t + ti) * h + hi) * d;
            y[to..to + d].copy_from_slice(&x[from..from + d]);
        }
        y
    }

    /// `[q, k, v]`, each `[b, h, t, d]`, as one `[b, t, 3, h, d]`.
    fn to_packed(x: [&[f32]; 3], b: usize, h: usize, t: usize, d: usize) -> Vec<f32> {
        let mut y = vec![0.0; 3 * x[0].len()];
        for (s, x) in x.iter().enumerate() {
            for (bi, hi, ti) in
                (0..b).flat_map(|bi| (0..h).flat_map(move |hi| (0..t).map(move |ti| (bi, hi, ti))))
            {
                let from = ((bi * h + hi) * t + ti) * d;
                let to = (((bi * t + ti) * 3 + s) * h + hi) * d;
                y[to..to + d].copy_from_slice(&x[from..from + d]);
            }
        }
        y
    }

    #[test]
    fn token_and_packed_layouts_compute_what_the_heads_layout_computes_on_the_same_rows() {
        let (b, h, t, d) = (2, 3, 5, 4);
        let n = b * h * t * d;
        let heads = Shape::new((b * h, t, t, d, true), 0.6, Layout::contiguous(t, t, d));
        let (q, k, v, w) = (data(n, 11), data(n, 12), data(n, 13), data(n, 14));
        let mut scratch = vec![0.0; backward_scratch_len(&heads).max(forward_scratch_len(&heads))];
        let (mut out, mut lse) = (vec![0.0; n], vec![0.0; b * h * t]);
        forward(&heads, &q, &k, &v, &mut out, &mut lse, &mut scratch);
        let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let grads = Grads::Separate {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        };
        backward(&heads, [&q, &k, &v, &out, &w], &lse, grads, &mut scratch);
        let tok = |x: &[f32]| to_tokens(x, b, h, t, d);

        // Tokens: every operand [b, t, h, d].
        let s = Shape {
            layout: Layout::tokens(h, t, t, d),
            ..heads
        };
        let (mut out_t, mut lse_t) = (vec![f32::NAN; n], vec![f32::NAN; b * h * t]);
        forward(
            &s,
            &tok(&q),
            &tok(&k),
            &tok(&v),
            &mut out_t,
            &mut lse_t,
            &mut scratch,
        );
        assert_eq!(out_t, tok(&out));
        assert_eq!(lse_t, lse);
        let (mut gq, mut gk, mut gv) = (vec![f32::NAN; n], vec![f32::NAN; n], vec![f32::NAN; n]);
        let grads = Grads::Separate {
            dq: &mut gq,
            dk: &mut gk,
            dv: &mut gv,
        };
        backward(
            &s,
            [&tok(&q), &tok(&k), &tok(&v), &out_t, &tok(&w)],
            &lse_t,
            grads,
            &mut scratch,
        );
        assert_eq!((gq, gk, gv), (tok(&dq), tok(&dk), tok(&dv)));

        // Packed: q, k, v the slots of one [b, t, 3, h, d]; out [b, t, h, d].
        let s = Shape {
            layout: Layout::packed(h, t, d),
            ..heads
        };
        let qkv = to_packed([&q, &k, &v], b, h, t, d);
        let at = |slot: usize| &qkv[Layout::packed_slot(h, d, slot)..];
        let (mut out_p, mut lse_p) = (vec![f32::NAN; n], vec![f32::NAN; b * h * t]);
        forward(
            &s,
            at(0),
            at(1),
            at(2),
            &mut out_p,
            &mut lse_p,
            &mut scratch,
        );
        assert_eq!(out_p, tok(&out));
        assert_eq!(lse_p, lse);
        let mut dqkv = vec![f32::NAN; 3 * n];
        let starts = [0, 1, 2].map(|slot| Layout::packed_slot(h, d, slot));
        let grads = Grads::Packed {
            dqkv: &mut dqkv,
            starts,
        };
        backward(
            &s,
            [at(0), at(1), at(2), &out_p, &tok(&w)],
            &lse_p,
            grads,
            &mut scratch,
        );
        assert_eq!(dqkv, to_packed([&dq, &dk, &dv], b, h, t, d));
    }

    /// Forward and backward of `s` on data from `seed`, by `speed`: out, lse, dq, dk, dv.
    fn run_by<T: Elem>(
        s: &Shape,
        from: impl Fn(f32) -> T,
        seed: u32,
        speed: Speed,
    ) -> (Vec<T>, Vec<f32>, Vec<T>) {
        let (bh, tq, tk, d) = (s.batch_heads, s.seq_q, s.seq_k, s.head_dim);
        let mk =
            |n: usize, k: u32| -> Vec<T> { data(n, seed * 8 + k).into_iter().map(&from).collect() };
        let (q, k, v, w) = (
            mk(bh * tq * d, 1),
            mk(bh * tk * d, 2),
            mk(bh * tk * d, 3),
            mk(bh * tq * d, 4),
        );
        let mut scratch = vec![f32::NAN; forward_scratch_len(s).max(backward_scratch_len(s))];
        let (mut out, mut lse) = (vec![from(0.0); q.len()], vec![0.0; bh * tq]);
        forward_with(s, [&q, &k, &v], &mut out, &mut lse, &mut scratch, speed);
        let mut grads = vec![from(f32::NAN); q.len() + 2 * k.len()];
        let (dq, rest) = grads.split_at_mut(q.len());
        let (dk, dv) = rest.split_at_mut(k.len());
        let g = Grads::Separate { dq, dk, dv };
        backward_with(s, [&q, &k, &v, &out, &w], &lse, g, &mut scratch, speed);
        (out, lse, grads)
    }

    #[test]
    fn transposed_keys_on_wide_vectors_give_the_bits_of_one_key_at_a_time_in_f32_and_bf16() {
        let bits32 = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let bits16 = |x: &[bf16]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let shapes = [
            (3, 64, 64, 16, true, Layout::contiguous(64, 64, 16)),
            (2, 5, 9, 7, false, Layout::contiguous(5, 9, 7)),
            (2, 9, 5, 3, true, Layout::contiguous(9, 5, 3)),
            (4, 17, 17, 1, true, Layout::tokens(2, 17, 17, 1)),
            (2, 70, 33, 8, true, Layout::tokens(1, 70, 33, 8)),
            // gpt-mini's heads: blocks of KEYS keys plus a rest, and a backward pass whose
            // transposed operands need more than 256 KiB of stack.
            (2, 256, 260, 64, true, Layout::contiguous(256, 260, 64)),
        ];
        for (seed, (bh, tq, tk, d, causal, layout)) in shapes.into_iter().enumerate() {
            let s = Shape::new((bh, tq, tk, d, causal), 0.37, layout);
            let seed = seed as u32;
            let (a, b) = (
                run_by(&s, |x| x, seed, Speed::Best),
                run_by(&s, |x| x, seed, Speed::Plain),
            );
            assert_eq!(bits32(&a.0), bits32(&b.0), "{s:?} out");
            assert_eq!(bits32(&a.1), bits32(&b.1), "{s:?} lse");
            assert_eq!(bits32(&a.2), bits32(&b.2), "{s:?} grads");
            assert!(
                a.2.iter().all(|x| x.is_finite()),
                "{s:?}: every gradient written"
            );
            let (a, b) = (
                run_by(&s, round_bf16, seed, Speed::Best),
                run_by(&s, round_bf16, seed, Speed::Plain),
            );
            assert_eq!(bits16(&a.0), bits16(&b.0), "{s:?} bf16 out");
            assert_eq!(bits32(&a.1), bits32(&b.1), "{s:?} bf16 lse");
            assert_eq!(bits16(&a.2), bits16(&b.2), "{s:?} bf16 grads");
        }
    }
}
