//! The attention kernels run on the host: their generated CUDA C, compiled by the host's C++
//! compiler with a small emulation of a CUDA block (every thread a coroutine, `__syncthreads`,
//! `__syncwarp` and shuffles as barriers between them, and the tensor-core instructions and
//! `ldmatrix` emulated from the PTX ISA's fragment layouts), computes what the f64 reference computes, for
//! every precision, causal and not, lengths that are not multiples of a tile, Tq ≠ Tk; in the
//! contiguous layout and in strided ones (token-major, packed q/k/v with k and v pointing into
//! q's buffer, token-major with gaps), with no byte written outside the outputs' rows.
//!
//! This checks the kernels' logic (tiling, masking, the online softmax, the backward's
//! recomputation, which thread stores what) without a GPU; the GPU test
//! (runtime/tests/cuda_attention.rs) checks the same on the device. Skips (saying so) without
//! a C++ compiler or `ucontext.h`.

use ingot_kernels::cuda::attention::{self, AttentionPrecision, AttentionShape, DqKernel};
use ingot_kernels::cuda::{CudaKernel, PRELUDE_BF16};
use ingot_testkit::cxx::{self, Emu};

#[path = "cuda_attention_support/placement.rs"]
mod placement;
#[path = "cuda_attention_support/reference.rs"]
mod reference;
#[path = "cuda_attention_support/values.rs"]
mod values;
use ingot_kernels::attention::Layout;
use placement::Operand::{Dk, Dq, Dv, Out};
use placement::{padded_tokens, Arg::*, Operand, Placement, DKDV, DQ, FORWARD, PREPROCESS};
use reference::relative_error;
use values::{decode, encode, f32s, inputs, problem, row_dots, tolerance};

/// The host's stand-ins for what the kernels use of CUDA: a block's threads are ucontext
/// coroutines run one at a time; a thread at a barrier yields, and the scheduler releases a
/// warp's barrier when its 32 lanes have all arrived, the block's when every thread has.
const EMU: &str = r#"#include <ucontext.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <utility>
#include <vector>
"#;

/// The rest of the emulation, after [`cxx::CUDA_ON_HOST`].
const EMU_REST: &str = r#"#define __align__(n) __attribute__((aligned(n)))
#define INGOT_FA_ASM
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct float2 { float x, y; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static Dim3 threadIdx, blockIdx;

enum { RUN = 0, WARP = 1, BLOCK = 2, DONE = 3 };
static const int MAXT = 256;
struct Fiber { ucontext_t ctx; int state; char* stack; };
static Fiber fib[MAXT];
static int nthreads, cur;
static ucontext_t sched;
static void yield_as(int st) { fib[cur].state = st; swapcontext(&fib[cur].ctx, &sched); }
static void __syncthreads() { yield_as(BLOCK); }
static void __syncwarp(unsigned = 0xffffffffu) { yield_as(WARP); }
static float xbuf[MAXT];
static float __shfl_xor_sync(unsigned, float v, int o) {
  const int me = cur;
  xbuf[me] = v;
  yield_as(WARP);
  const float r = xbuf[(me & ~31) | ((me & 31) ^ o)];
  yield_as(WARP);
  return r;
}
static unsigned abuf[MAXT][4], bbuf[MAXT][2];
static float lo(unsigned u) { return __uint_as_float(u << 16); }
static float hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
// C[16 x 8] += A[16 x K] B[K x 8] from the warp's fragments (K = 16 bf16 or 8 tf32), each dot
// product in double, rounded once into the f32 accumulator.
static void warp_mma(float* c, const unsigned* a, const unsigned* b, bool bf) {
  const int me = cur;
  memcpy(abuf[me], a, 16);
  memcpy(bbuf[me], b, 8);
  yield_as(WARP);
  const int base = me & ~31, g = (me & 31) >> 2, t = me & 3;
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int gg = l >> 2, tt = l & 3;
    const unsigned* ar = abuf[base + l];
    const unsigned* br = bbuf[base + l];
    if (bf) {
      A[gg][2 * tt] = lo(ar[0]); A[gg][2 * tt + 1] = hi(ar[0]);
      A[gg + 8][2 * tt] = lo(ar[1]); A[gg + 8][2 * tt + 1] = hi(ar[1]);
      A[gg][2 * tt + 8] = lo(ar[2]); A[gg][2 * tt + 9] = hi(ar[2]);
      A[gg + 8][2 * tt + 8] = lo(ar[3]); A[gg + 8][2 * tt + 9] = hi(ar[3]);
      B[2 * tt][gg] = lo(br[0]); B[2 * tt + 1][gg] = hi(br[0]);
      B[2 * tt + 8][gg] = lo(br[1]); B[2 * tt + 9][gg] = hi(br[1]);
    } else {
      A[gg][tt] = __uint_as_float(ar[0]); A[gg + 8][tt] = __uint_as_float(ar[1]);
      A[gg][tt + 4] = __uint_as_float(ar[2]); A[gg + 8][tt + 4] = __uint_as_float(ar[3]);
      B[tt][gg] = __uint_as_float(br[0]); B[tt + 4][gg] = __uint_as_float(br[1]);
    }
  }
  const int K = bf ? 16 : 8;
  for (int e = 0; e < 4; ++e) {
    const int r = e < 2 ? g : g + 8, col = 2 * t + (e & 1);
    double acc = c[e];
    for (int k = 0; k < K; ++k) acc += (double)A[r][k] * (double)B[k][col];
    c[e] = (float)acc;
  }
  yield_as(WARP);
}
static void ig_fa_mma_bf16(float* c, const unsigned* a, const unsigned* b) { warp_mma(c, a, b, true); }
static void ig_fa_mma_tf32(float* c, const unsigned* a, const unsigned* b) { warp_mma(c, a, b, false); }
// ldmatrix.x4 (`trans`: .trans): lane l addresses row l % 8 of matrix l / 8 and gets, of each
// matrix i, the pair (row l / 4, columns 2 (l % 4), + 1), or of the transposed matrix.
static const unsigned short* pbuf[MAXT];
static void ldsm(unsigned* r, const unsigned short* p, bool trans) {
  const int me = cur;
  pbuf[me] = p;
  yield_as(WARP);
  const int base = me & ~31, l = me & 31;
  for (int i = 0; i < 4; ++i) {
    if (!trans) {
      const unsigned short* row = pbuf[base + 8 * i + l / 4];
      r[i] = (unsigned)row[2 * (l % 4)] | ((unsigned)row[2 * (l % 4) + 1] << 16);
    } else {
      const unsigned short* r0 = pbuf[base + 8 * i + 2 * (l % 4)];
      const unsigned short* r1 = pbuf[base + 8 * i + 2 * (l % 4) + 1];
      r[i] = (unsigned)r0[l / 4] | ((unsigned)r1[l / 4] << 16);
    }
  }
  yield_as(WARP);
}
static void ig_fa_ldsm4(unsigned* r, const unsigned short* p) { ldsm(r, p, false); }
static void ig_fa_ldsm4_t(unsigned* r, const unsigned short* p) { ldsm(r, p, true); }
// cvt.rna.tf32.f32: 10 mantissa bits, to nearest, ties away from zero (finite inputs).
static unsigned ig_fa_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }
// cp.async as the hardware may run it: a thread's copies are queued when issued and land only
// at its cp.async.wait_group that covers their group (none commits no group), so a tile read
// before its wait and barrier reads what was there before, and the checks see it.
struct CpCopy { void* dst; const void* src; bool valid; int group; };
static std::vector<CpCopy> cp_pending[MAXT];
static int cp_group[MAXT];
static void ig_fa_cp16(void* dst, const void* src, bool valid) { cp_pending[cur].push_back({dst, src, valid, cp_group[cur]}); }
static void ig_fa_cp_commit() { cp_group[cur]++; }
template <int N> static void ig_fa_cp_wait() {
  std::vector<CpCopy> keep;
  for (const CpCopy& c : cp_pending[cur]) {
    if (c.group < cp_group[cur] - N) {
      if (c.valid) memcpy(c.dst, c.src, 16); else memset(c.dst, 0, 16);
    } else {
      keep.push_back(c);
    }
  }
  cp_pending[cur].swap(keep);
}
typedef void (*Runner)(void**);
template <typename... A, size_t... I> static void call_impl(void (*f)(A...), void** b, std::index_sequence<I...>) { f((A)b[I]...); }
template <typename... A> static void call(void (*f)(A...), void** b) { call_impl(f, b, std::index_sequence_for<A...>{}); }
"#;

/// Runs one kernel: argv[1] the kernel's index; stdin: grid, block, buffer count, each buffer
/// (length, bytes), argument count, each argument (buffer index, byte offset: several may point
/// into one buffer, as packed q, k and v do); stdout: every buffer after the run.
const MAIN: &str = r#"
static Runner g_run;
static void** g_args;
static void fiber_main(int id) { g_run(g_args); fib[id].state = DONE; }
static void run_block(int threads) {
  nthreads = threads;
  for (int i = 0; i < threads; ++i) {
    getcontext(&fib[i].ctx);
    fib[i].ctx.uc_stack.ss_sp = fib[i].stack;
    fib[i].ctx.uc_stack.ss_size = 1 << 18;
    fib[i].ctx.uc_link = &sched;
    makecontext(&fib[i].ctx, (void (*)())fiber_main, 1, i);
    fib[i].state = RUN;
  }
  for (;;) {
    for (int i = 0; i < threads; ++i) {
      if (fib[i].state != RUN) continue;
      cur = i;
      threadIdx.x = (unsigned)i;
      swapcontext(&sched, &fib[i].ctx);
    }
    int done = 0, block = 0;
    bool released = false;
    for (int i = 0; i < threads; ++i) { done += fib[i].state == DONE; block += fib[i].state == BLOCK; }
    if (done == threads) {
      // Every copy a thread issued landed before it ended (none left in flight).
      for (int i = 0; i < threads; ++i) {
        if (!cp_pending[i].empty()) { fprintf(stderr, "thread %d ended with %zu cp.async copies in flight\n", i, cp_pending[i].size()); exit(7); }
      }
      return;
    }
    for (int w = 0; w < threads; w += 32) {
      int warp = 0;
      for (int l = w; l < w + 32 && l < threads; ++l) warp += fib[l].state == WARP;
      if (warp > 0 && warp == (threads - w < 32 ? threads - w : 32)) {
        for (int l = w; l < w + 32 && l < threads; ++l) fib[l].state = RUN;
        released = true;
      }
    }
    if (!released && block > 0 && block + done == threads && done == 0) {
      for (int i = 0; i < threads; ++i) fib[i].state = RUN;
      released = true;
    }
    if (!released) { fprintf(stderr, "deadlock: %d done, %d at __syncthreads of %d\n", done, block, threads); exit(3); }
  }
}
static unsigned long long rd() { unsigned long long x; if (fread(&x, 8, 1, stdin) != 1) exit(4); return x; }
int main(int argc, char** argv) {
  if (argc < 2) return 1;
  const int which = atoi(argv[1]);
  for (int i = 0; i < MAXT; ++i) fib[i].stack = (char*)malloc(1 << 18);
  const unsigned long long grid = rd(), block = rd(), n = rd();
  std::vector<std::vector<unsigned char>> bufs(n);
  std::vector<void*> ptrs(n);
  for (unsigned long long i = 0; i < n; ++i) {
    bufs[i].resize(rd() + 16);
    if (fread(bufs[i].data(), 1, bufs[i].size() - 16, stdin) != bufs[i].size() - 16) return 5;
    // 16-byte aligned, as device allocations are (vector loads).
    void* p = aligned_alloc(256, (bufs[i].size() + 255) / 256 * 256);
    memcpy(p, bufs[i].data(), bufs[i].size());
    ptrs[i] = p;
  }
  const unsigned long long m = rd();
  std::vector<void*> args(m);
  for (unsigned long long i = 0; i < m; ++i) {
    const unsigned long long b = rd(), off = rd();
    if (b >= n || off > bufs[b].size() - 16) return 6;
    args[i] = (char*)ptrs[b] + off;
  }
  g_run = KERNELS[which];
  g_args = args.data();
  for (unsigned long long b = 0; b < grid; ++b) { blockIdx.x = (unsigned)b; run_block((int)block); }
  for (unsigned long long i = 0; i < n; ++i) fwrite(ptrs[i], 1, bufs[i].size() - 16, stdout);
  return 0;
}
"#;

/// The emulation program holding `kernels` (each once, by name); `None` (after saying so)
/// without a C++ compiler or `ucontext.h`.
fn build(kernels: &[&CudaKernel]) -> Option<Emu> {
    let cxx = cxx::host_cxx_or_skip()?;
    // The kernels use the bf16 helpers only (not the integer and conversion helpers of
    // PRELUDE, which need more CUDA built-ins than this emulation has).
    let head = format!("{EMU}{}{EMU_REST}{PRELUDE_BF16}", cxx::CUDA_ON_HOST);
    // One directory a build: the tests build their programs in parallel.
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = format!("ingot_fa_emu_{n}");
    match Emu::build(cxx, &dir, &head, kernels.iter().copied(), MAIN) {
        Ok(emu) => Some(emu),
        Err(err) if err.contains("ucontext.h") => {
            eprintln!("skipping: the host has no ucontext.h");
            None
        }
        Err(err) => panic!(
            "the attention kernels do not compile on the host: {}",
            err.lines().take(40).collect::<Vec<_>>().join("\n")
        ),
    }
}

/// Runs `k` with its parameters pointing at `args` (buffer index, byte offset into it) of
/// `bufs`; returns the buffers afterwards.
fn run(emu: &Emu, k: &CudaKernel, bufs: &[Vec<u8>], args: &[(usize, usize)]) -> Vec<Vec<u8>> {
    assert_eq!(
        k.launch.grid[1] * k.launch.grid[2] * k.launch.block[1] * k.launch.block[2],
        1
    );
    let mut stdin = cxx::launch_input(k, bufs);
    stdin.extend((args.len() as u64).to_ne_bytes());
    for &(b, offset) in args {
        stdin.extend((b as u64).to_ne_bytes());
        stdin.extend((offset as u64).to_ne_bytes());
    }
    cxx::split_like(&emu.run(k, stdin), bufs)
}

fn shape(
    p: AttentionPrecision,
    bh: usize,
    tq: usize,
    tk: usize,
    d: usize,
    causal: bool,
) -> AttentionShape {
    placement::shape(p, (bh, tq, tk, d, causal), Layout::contiguous(tq, tk, d))
}

/// Runs forward and backward of `s` (dq computed as `how` says) in the emulation, its operands
/// placed by `at` (whose layout is `s.layout`), and compares every output with the reference
/// and checks that no kernel wrote outside its outputs' rows; returns the failures.
fn check(
    emu: &Emu,
    (s, how): (&AttentionShape, DqKernel),
    at: &Placement,
    seed: u64,
) -> Vec<String> {
    let p = s.precision;
    let prob = problem(s);
    // Inputs as the kernels see them (rounded to the storage type).
    let [q, k, v, dout] = inputs(p, &prob, seed);
    let (want_out, want_lse) = prob.forward(&q, &k, &v);
    let (want_dq, want_dk, want_dv, terms) = prob.backward(&q, &k, &v, &dout);
    let es = if p == AttentionPrecision::Bf16 { 2 } else { 4 };
    let mut bufs: Vec<Vec<u8>> = at
        .inputs([&q, &k, &v, &dout])
        .into_iter()
        .zip(&at.lens)
        .map(|(b, &n)| match b {
            Some(values) => encode(p, &values),
            None => vec![0xff; n * es],
        })
        .collect();
    // lse, then the backward's workspace: delta and (bf16) the stored ds, NaN bytes until
    // written.
    bufs.extend([
        vec![0xff; prob.bh * prob.tq * 4],
        vec![0xff; attention::backward_workspace_bytes_with(s, how)],
    ]);
    let fwd = attention::forward(s).unwrap();
    let bwd = attention::backward_with(s, how).unwrap();
    let mut bad = Vec::new();
    for (name, kernel, args, written) in [
        ("forward", &fwd, &FORWARD[..], &[Out][..]),
        ("preprocess", &bwd.preprocess, &PREPROCESS[..], &[Out][..]),
        ("dkdv", &bwd.dkdv, &DKDV[..], &[Out, Dk, Dv][..]),
        ("dq", &bwd.dq, &DQ[..], &[Out, Dk, Dv, Dq][..]),
    ] {
        let args: Vec<(usize, usize)> = args
            .iter()
            .map(|&a| {
                let (b, elems) = at.arg(a);
                (b, elems * es)
            })
            .collect();
        bufs = run(emu, kernel, &bufs, &args);
        if let Err(e) = at.untouched(&bufs, es, written) {
            bad.push(format!("{s:?}: after {name}: {e}"));
        }
    }
    let values = |op: Operand| at.gather(op, &decode(p, &bufs[at.site(op).buffer]));
    let out = values(Out);
    let want_delta = row_dots(&prob, &out, &dout);
    let tol = tolerance(p);
    for (what, got, want, tol, floor) in [
        ("out", out.clone(), want_out, tol, 1e-3),
        ("lse", f32s(&bufs[at.arg(Lse).0]), want_lse, tol, 1e-3),
        (
            "delta",
            f32s(&bufs[at.arg(Delta).0][..prob.bh * prob.tq * 4]),
            want_delta,
            1e-5,
            1e-3,
        ),
        ("dk", values(Dk), want_dk, tol, terms),
        ("dv", values(Dv), want_dv, tol, 1e-3),
        ("dq", values(Dq), want_dq, tol, terms),
    ] {
        let e = relative_error(&got, &want, floor);
        eprintln!(
            "{:?} {} {} {} {} heads {} {how:?} {what}: {e:.2e}",
            p, s.seq_q, s.seq_k, s.head_dim, s.causal, s.layout.heads
        );
        if e.is_nan() || e > tol {
            bad.push(format!(
                "{s:?} {how:?}: {what} differs by {e:.2e} (tolerance {tol:.0e})"
            ));
        }
    }
    bad
}

/// Each way of computing dq for `s`: recomputing, and for bf16 from the stored ds.
fn dq_kernels(s: &AttentionShape) -> Vec<DqKernel> {
    if s.precision == AttentionPrecision::Bf16 {
        vec![DqKernel::Recompute, DqKernel::StoredDs]
    } else {
        vec![DqKernel::Recompute]
    }
}

/// Builds the emulation of every kernel of `cases` (each way of computing dq) and checks each
/// case; panics with the failures.
fn check_all(cases: &[(AttentionShape, Placement)]) {
    let kernels: Vec<(CudaKernel, attention::AttentionBackward)> = cases
        .iter()
        .flat_map(|(s, _)| dq_kernels(s).into_iter().map(move |how| (s, how)))
        .map(|(s, how)| {
            (
                attention::forward(s).unwrap(),
                attention::backward_with(s, how).unwrap(),
            )
        })
        .collect();
    let all: Vec<&CudaKernel> = kernels
        .iter()
        .flat_map(|(f, b)| [f, &b.preprocess, &b.dkdv, &b.dq])
        .collect();
    let Some(emu) = build(&all) else { return };
    let mut bad = Vec::new();
    for (i, (s, at)) in cases.iter().enumerate() {
        for how in dq_kernels(s) {
            bad.extend(check(&emu, (s, how), at, 10 * i as u64));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_attention_kernels_emulated_on_the_host_match_the_f64_reference() {
    use AttentionPrecision::*;
    let mut shapes = Vec::new();
    for p in [F32, Tf32, Bf16] {
        // Odd lengths (a partial tile), a causal diagonal crossing tiles, Tq ≠ Tk both ways.
        shapes.push(shape(p, 2, 17, 17, 32, true));
        shapes.push(shape(p, 1, 70, 70, 80, true));
        shapes.push(shape(p, 1, 33, 70, 64, false));
        shapes.push(shape(p, 1, 1, 20, 128, false));
    }
    shapes.push(shape(Bf16, 1, 70, 37, 96, true));
    // bf16's stored ds past its key blocks: query row blocks 1 and 2 of a causal problem with
    // one 64-key block hold that block only.
    shapes.push(shape(Bf16, 1, 150, 40, 64, true));
    shapes.push(shape(F32, 1, 37, 70, 48, true));
    let cases: Vec<(AttentionShape, Placement)> = shapes
        .into_iter()
        .map(|s| {
            let at = Placement::separate(s.layout, s.batch_heads, s.seq_q, s.seq_k, s.head_dim);
            (s, at)
        })
        .collect();
    check_all(&cases);
}

/// Token-major operands, packed q/k/v (k and v pointing into q's buffer, dk and dv into dq's),
/// and token-major rows with gaps between them: read and written where they lie, nothing
/// written in the gaps or in another operand's slot.
#[test]
fn strided_layouts_emulated_on_the_host_match_the_f64_reference() {
    use AttentionPrecision::*;
    let mut cases = Vec::new();
    for p in [F32, Tf32, Bf16] {
        // batch 2, heads 3: problem bh is batch bh / 3, head bh % 3; Tq ≠ Tk, a partial tile.
        let (heads, tq, tk, d) = (3, 17, 40, 32);
        let layout = Layout::tokens(heads, tq, tk, d);
        let s = AttentionShape {
            layout,
            ..shape(p, 2 * heads, tq, tk, d, p != Tf32)
        };
        cases.push((s, Placement::separate(layout, s.batch_heads, tq, tk, d)));
        // batch 2, heads 2, one sequence of 33 (self-attention).
        let (heads, t, d) = (2, 33, 64);
        let at = Placement::packed(heads, 2 * heads, t, d);
        let s = AttentionShape {
            layout: at.layout,
            ..shape(p, 2 * heads, t, t, d, p != F32)
        };
        cases.push((s, at));
    }
    // Gaps of 16 elements after every token and every batch.
    let layout = padded_tokens(2, 20, 20, 48, 16);
    let s = AttentionShape {
        layout,
        ..shape(Bf16, 4, 20, 20, 48, true)
    };
    cases.push((s, Placement::separate(layout, 4, 20, 20, 48)));
    check_all(&cases);
}
