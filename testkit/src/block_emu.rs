//! A host emulation of CUDA blocks for the generated fused kernels (every strategy: rows,
//! columns, elementwise): compiled by the host's C++ compiler ([`crate::cxx`]) with the
//! kernels, it runs a launch block after block, each block's threads as `ucontext`
//! coroutines: a thread at `__syncthreads` or `__syncwarp` yields, a warp's shuffle is a
//! barrier of its 32 lanes (values exchanged through a table), and the scheduler releases a
//! warp when its lanes have all arrived, the block when every thread has. Parameters point
//! into buffers at byte offsets, so that a program's launches can share one scratch buffer as
//! they share the node's workspace on the device.
//!
//! So the kernel tests check the generated CUDA C's logic (loops, reductions across lanes and
//! warps, shared memory, vector loads) without a GPU.

use crate::cxx::{self, Emu};
use ingot_kernels::cuda::{CudaKernel, FusedArg, FusedProgram, PRELUDE, PRELUDE_BF16};
use ingot_kernels::fused::random::widened;
use ingot_kernels::fused::FusedKernel;
use ingot_kernels::DType;

/// The host's stand-ins for the CUDA built-ins the fused kernels use, before the preludes.
const SHIM: &str = r#"#include <ucontext.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <utility>
#include <vector>
"#;

/// The rest of the shim, after [`cxx::CUDA_ON_HOST`].
const SHIM_REST: &str = r#"struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
struct uchar4 { unsigned char x, y, z, w; };
struct ushort4 { unsigned short x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct Dim3 { unsigned x = 1, y = 1, z = 1; };
static Dim3 threadIdx, blockIdx, gridDim, blockDim;
static int __float2int_rz(float x) { return (int)x; }
static int __double2int_rz(double x) { return (int)x; }
static long long __float2ll_rz(float x) { return (long long)x; }
static long long __double2ll_rz(double x) { return (long long)x; }

enum { RUN = 0, WARP = 1, BLOCK = 2, DONE = 3 };
static const int MAXT = 1024;
struct Fiber { ucontext_t ctx; int state; char* stack; };
static Fiber fib[MAXT];
static int cur;
static ucontext_t sched;
static void yield_as(int st) { fib[cur].state = st; swapcontext(&fib[cur].ctx, &sched); }
static void __syncthreads() { yield_as(BLOCK); }
static void __syncwarp(unsigned = 0xffffffffu) { yield_as(WARP); }
static unsigned long long xbuf[MAXT];
template <typename T> static T __shfl_xor_sync(unsigned, T v, int o) {
  const int me = cur;
  memcpy(&xbuf[me], &v, sizeof(T));
  yield_as(WARP);
  T r;
  memcpy(&r, &xbuf[(me & ~31) | ((me & 31) ^ o)], sizeof(T));
  yield_as(WARP);
  return r;
}
typedef void (*Runner)(void**);
template <typename... A, size_t... I> static void call_impl(void (*f)(A...), void** b, std::index_sequence<I...>) { f((A)b[I]...); }
template <typename... A> static void call(void (*f)(A...), void** b) { call_impl(f, b, std::index_sequence_for<A...>{}); }
"#;

/// argv[1]: the kernel's index; stdin: grid, the block's x and y, buffer count, each buffer (length, bytes),
/// argument count, each argument (buffer index, byte offset); stdout: every buffer after the
/// run.
const MAIN: &str = r#"
static Runner g_run;
static void** g_args;
static void fiber_main(int id) { g_run(g_args); fib[id].state = DONE; }
static void run_block(int threads, int bx) {
  for (int i = 0; i < threads; ++i) {
    getcontext(&fib[i].ctx);
    fib[i].ctx.uc_stack.ss_sp = fib[i].stack;
    fib[i].ctx.uc_stack.ss_size = 1 << 16;
    fib[i].ctx.uc_link = &sched;
    makecontext(&fib[i].ctx, (void (*)())fiber_main, 1, i);
    fib[i].state = RUN;
  }
  for (;;) {
    for (int i = 0; i < threads; ++i) {
      if (fib[i].state != RUN) continue;
      cur = i;
      // A block's threads in CUDA's linear order: x fastest, a warp 32 consecutive of them.
      threadIdx.x = (unsigned)(i % bx);
      threadIdx.y = (unsigned)(i / bx);
      swapcontext(&sched, &fib[i].ctx);
    }
    int done = 0, block = 0;
    bool released = false;
    for (int i = 0; i < threads; ++i) { done += fib[i].state == DONE; block += fib[i].state == BLOCK; }
    if (done == threads) return;
    for (int w = 0; w < threads; w += 32) {
      int warp = 0, gone = 0;
      for (int l = w; l < w + 32 && l < threads; ++l) { warp += fib[l].state == WARP; gone += fib[l].state == DONE; }
      if (warp > 0 && warp + gone == (threads - w < 32 ? threads - w : 32)) {
        for (int l = w; l < w + 32 && l < threads; ++l) fib[l].state = RUN;
        released = true;
      }
    }
    if (!released && block > 0 && block + done == threads) {
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
  for (int i = 0; i < MAXT; ++i) fib[i].stack = (char*)malloc(1 << 16);
  const unsigned long long grid = rd(), bx = rd(), by = rd(), n = rd();
  const unsigned long long block = bx * by;
  if (bx == 0 || block > (unsigned long long)MAXT) return 7;
  std::vector<unsigned long long> lens(n);
  std::vector<void*> ptrs(n);
  for (unsigned long long i = 0; i < n; ++i) {
    lens[i] = rd();
    // 256-byte aligned, as device allocations are (vector loads).
    void* p = aligned_alloc(256, (lens[i] + 255) / 256 * 256 + 256);
    if (fread(p, 1, lens[i], stdin) != lens[i]) return 5;
    ptrs[i] = p;
  }
  const unsigned long long m = rd();
  std::vector<void*> args(m);
  for (unsigned long long i = 0; i < m; ++i) {
    const unsigned long long b = rd(), off = rd();
    if (b >= n || off > lens[b]) return 6;
    args[i] = (char*)ptrs[b] + off;
  }
  g_run = KERNELS[which];
  g_args = args.data();
  gridDim.x = (unsigned)grid;
  blockDim.x = (unsigned)bx;
  blockDim.y = (unsigned)by;
  for (unsigned long long b = 0; b < grid; ++b) { blockIdx.x = (unsigned)b; run_block((int)block, (int)bx); }
  for (unsigned long long i = 0; i < n; ++i) fwrite(ptrs[i], 1, lens[i], stdout);
  return 0;
}
"#;

/// The emulation program holding `kernels` (each once, by name), built in the temporary
/// directory `dir`; `None` (after saying so) without a C++ compiler or `ucontext.h`. Panics,
/// showing the compiler's first errors, where the kernels do not compile on the host.
pub fn build<'a>(dir: &str, kernels: impl IntoIterator<Item = &'a CudaKernel>) -> Option<Emu> {
    let cxx = cxx::host_cxx_or_skip()?;
    let head = format!(
        "{SHIM}{}{SHIM_REST}{PRELUDE}{PRELUDE_BF16}",
        cxx::CUDA_ON_HOST
    );
    match Emu::build(cxx, dir, &head, kernels, MAIN) {
        Ok(emu) => Some(emu),
        Err(err) if err.contains("ucontext.h") => {
            eprintln!("skipping: the host has no ucontext.h");
            None
        }
        Err(err) => panic!(
            "the kernels do not compile on the host: {}",
            err.lines().take(40).collect::<Vec<_>>().join("\n")
        ),
    }
}

/// Runs `k`, a launch of a one-dimensional grid (blocks of one or two dimensions: the column
/// strategy's are `(X, Y)`), with its parameters pointing at `args` (buffer index, byte offset
/// into it) of `bufs`; returns the buffers afterwards.
pub fn run(emu: &Emu, k: &CudaKernel, bufs: &[Vec<u8>], args: &[(usize, usize)]) -> Vec<Vec<u8>> {
    assert_eq!(
        k.launch.grid[1] * k.launch.grid[2] * k.launch.block[2],
        1,
        "{}: the emulation runs one-dimensional grids of blocks of at most two dimensions",
        k.name
    );
    let mut stdin = Vec::new();
    for x in [k.launch.grid[0], k.launch.block[0], k.launch.block[1]] {
        stdin.extend(u64::from(x).to_ne_bytes());
    }
    stdin.extend((bufs.len() as u64).to_ne_bytes());
    for b in bufs {
        stdin.extend((b.len() as u64).to_ne_bytes());
        stdin.extend(b);
    }
    stdin.extend((args.len() as u64).to_ne_bytes());
    for &(b, offset) in args {
        stdin.extend((b as u64).to_ne_bytes());
        stdin.extend((offset as u64).to_ne_bytes());
    }
    cxx::split_like(&emu.run(k, stdin), bufs)
}

/// Runs fused kernel `k`'s program `p` in the emulation, built under `dir`: inputs `ins`,
/// outputs (filled with 0xA5) and one scratch buffer (filled with NaNs, so that a read before
/// a write shows), each launch's parameters where the program points them; asserts that no
/// launch writes an input. Returns the outputs; `None` where the emulation cannot be built.
pub fn run_program(
    dir: &str,
    k: &FusedKernel,
    p: &FusedProgram,
    ins: &[Vec<u8>],
) -> Option<Vec<Vec<u8>>> {
    let emu = build(dir, p.launches.iter().map(|l| &l.kernel))?;
    let (ni, no) = (k.inputs.len(), k.outputs.len());
    let mut bufs: Vec<Vec<u8>> = ins.to_vec();
    for j in 0..no {
        bufs.push(vec![0xA5; k.output_len(j) * k.output_dtype(j).size()]);
    }
    bufs.push(
        std::iter::repeat_n(f32::NAN.to_ne_bytes(), p.scratch_bytes / 4)
            .flatten()
            .collect(),
    );
    for l in &p.launches {
        let args: Vec<(usize, usize)> = (l.args.iter())
            .map(|a| match *a {
                FusedArg::Input(n) => (n, 0),
                FusedArg::Output(j) => (ni + j, 0),
                FusedArg::Scratch { offset, .. } => (ni + no, offset),
            })
            .collect();
        bufs = run(&emu, &l.kernel, &bufs, &args);
        assert_eq!(
            bufs[..ni],
            ins[..],
            "{dir}: {} wrote an input",
            l.kernel.name
        );
    }
    let _ = std::fs::remove_dir_all(emu.exe.parent().unwrap());
    Some(bufs[ni..ni + no].to_vec())
}

/// Deterministic values in [-1, 1), exact in bf16 (8 significant bits): inputs for emulated
/// kernels that any dtype holds exactly.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 56) as f32 - 128.0) / 128.0
        })
        .collect()
}

/// `xs` as the bytes of a buffer of `dtype` (f32 or bf16).
pub fn encode(dtype: DType, xs: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => xs.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        DType::BF16 => (xs.iter())
            .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_ne_bytes())
            .collect(),
        d => panic!("no {d:?} inputs here"),
    }
}

/// Asserts that kernel `k`'s emulated outputs `got` are the CPU interpreter's `want`: f32
/// outputs within 1e-4 of their largest magnitude (sums folded in another order), bf16 ones
/// within one bf16 rounding of it, any other dtype equal. The panic names the output and
/// element.
pub fn assert_outputs_match(tag: &str, k: &FusedKernel, got: &[Vec<u8>], want: &[Vec<u8>]) {
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        let dt = k.output_dtype(j);
        let (g, w) = (widened(dt, g), widened(dt, w));
        assert_eq!(g.len(), w.len());
        let scale = w.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
        let tol = match dt {
            DType::F32 => 1e-4 * scale,
            DType::BF16 => scale / 128.0,
            _ => 0.0,
        };
        for (e, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= tol,
                "{tag} output {j} element {e}: emulated {a}, CPU {b} (scale {scale})"
            );
        }
    }
}
