//! The CUDA C code generator: fused-kernel descriptions (and the three ops that are not fused
//! kernels: gather, scatter-add, concat) become CUDA C source text and launch shapes.
//!
//! Nothing here touches a device: the runtime compiles the text with NVRTC (default options plus
//! `--gpu-architecture=compute_XY`) and launches it. Every pointer a kernel gets must be 16-byte
//! aligned (the memory plan places every buffer at a multiple of 256 bytes): elementwise kernels
//! read and write 16-byte vectors where the accesses allow. A module's source is [`PRELUDE`] followed by
//! the distinct kernels' sources, each once; a kernel's name is a hash of its text, so the same
//! kernel generated for twelve layers is compiled once.
//!
//! # Kernel parameters
//! [`fused`]: one device pointer per input in order (`const T*`), then one per output (`T*`),
//! nothing else. No pointer is `__restrict__`: an output may be written over an input where
//! [`FusedKernel::can_write_over`](crate::FusedKernel::can_write_over) allows it. Element types
//! are `float`, `double`, `int`, `long long`, `unsigned char` (bool, 0 or 1) and `unsigned short`
//! (bf16's 16 bits).
//!
//! # bf16
//! bf16 memory is `unsigned short` (no `cuda_bf16.h`: NVRTC need not find it); a register holds
//! the float a bf16 value widens to, and every instruction computes on those floats, exactly as
//! the CPU's fused executor does (`crate::fused::cpu`, "bf16"), so that each bf16 value has the
//! same bits wherever the f32 arithmetic is the same: a load widens (`ig_widen`), an index,
//! unary or binary instruction of dtype bf16 rounds its f32 result to the nearest bf16, ties to
//! even (`ig_round`), a conversion to bf16 rounds once (`ig_to_bf16`; from f64 through a float
//! rounded to odd, as `dtype::bf16_from_f64`), a constant is its rounded value, a reduction
//! accumulates in f32 and rounds once when its threads have combined, and a store narrows
//! (`ig_narrow`, exact). The helpers are [`PRELUDE_BF16`], which a module gets only when one of
//! its kernels uses them ([`prelude_for`]). Gather and concat move the 16 bits; scatter-add
//! sums bf16 rows in f32 in position order and rounds each sum once. In a kernel that holds
//! bf16 values (`FusedKernel::holds_bf16`) f32 division is the hardware's full-range
//! approximation (`ig_fdiv`, `div.full.f32`: at most 2 ulp, what Triton 3.6's `/` on f32 lowers
//! to, so torch.compile's kernels too; triton-lang/triton#10661), not IEEE division: its error
//! is far below the bf16 rounding around it, and IEEE division (a reciprocal, its refinement and a
//! slow-path check per element) was the largest cost of gpt2's plain-attention softmax
//! kernels, which run out of instructions before memory; the CPU checks such quotients within
//! the bf16 kernels' drift tolerance. Kernels without bf16 divide as IEEE does. Likewise f32
//! exp in such a kernel is the prelude's `ig_exp` (`ex2.approx` of `x log2(e)`, a relative
//! error of at most 2 ulp + (1 + |x|) 2^-23), not CUDA's `expf`: gpt2's bf16 cross-entropy
//! kernel, two exponentials an element, 958.7 -> 852.1 us on an H200 (session 41); kernels
//! without bf16 call `expf`. (A branch-free tanh of the same kind made GELU's kernels slower,
//! 46.8 -> 52.1 us, and was taken back: they call CUDA's `tanhf`.) Elementwise kernels read
//! and write bf16 four elements at a time as `ushort4` (8 bytes) under the same rules as the
//! 16-byte vectors of the other types (below), each lane widened on load and narrowed on store.
//!
//! # How a fused kernel is laid out ([`Strategy`])
//! - **Elementwise** (no reduce axes, or every reduce axis of size 1, where a reduction is a
//!   copy): a grid-stride loop over the domain's elements, block 256, grid
//!   `min(ceil(numel / 256), 132 * 32)`. The linear index is split into domain indices only where
//!   a load (or an index instruction) needs them; a load whose access is the contiguous map of
//!   the domain (up to a scale) reads at the linear index itself. When the innermost axis of
//!   size > 1 is a multiple of 4 long, every output is f32, i32, bool or bf16, and every load is
//!   either contiguous along it (of those types, at an offset and outer strides that are
//!   multiples of 4 elements, so 16-byte aligned) or broadcast along it, each thread takes four
//!   consecutive elements instead: vector loads (`float4`, `int4`, `uchar4`) and vector stores,
//!   grid `min(ceil(numel / 1024), 132 * 32)` (kernels of at least 2^22 elements; smaller ones
//!   measured slightly slower that way). A transposing kernel (a load contiguous along another
//!   axis than the innermost one, at least 2^16 elements) goes through 32 × 32 tiles in shared
//!   memory instead, block (32, 8), one tile per block, so that both its reads and its writes
//!   coalesce.
//! - **Rows** (the innermost axis of size > 1 is reduced, or there are fewer than 64 rows):
//!   threads stride over a row's elements, so that consecutive threads read consecutive memory.
//!   Rows of up to 1024 elements get a group of `w` lanes of one warp each (`w` the row length
//!   rounded up to a power of two, at most 32), 256 / `w` rows a block of 256 threads, and
//!   combine their partials by shuffles alone; longer rows get a block each (256 threads; 512
//!   for rows of 16384 or more; 1024 for rows of 4096 or more when there are few rows),
//!   combining by warp shuffles and then across warps through shared memory. Each reduction
//!   level is one pass over the row, a final pass computes and stores the full outputs. The
//!   loads that several of these loops read are kept in registers by the first loop that reads
//!   them (the loops unrolled, so that the cached arrays are indexed by constants), when they
//!   fit in 32 registers a thread: as laid out above if every load the loops read is cached
//!   and a thread has at most 32 elements of the row (a short softmax), or at most 8 elements;
//!   otherwise the row gets a block of the fewest threads (64 to 1024) that leave each thread
//!   at most 4 elements (8 with 1024 threads): GPT-2's attention backward, rows of 1024 with
//!   two cached loads, gets 256 threads of 4 elements; a LayerNorm over 768, 256 threads of 3.
//!   The row is then read from memory once. With the cache, the final loop's own loads (those no
//!   earlier loop read) are read into registers by a loop of their own before its first store,
//!   while they fit in 16 registers a thread: an output may be written over an input, and a
//!   load issued after a store to the same row waits for it (gpt2's tf32 LayerNorm backward:
//!   197 µs, 63 µs with its loads first). Rows too long for either read memory in every loop,
//!   a 16-byte vector a thread (four f32, or eight bf16) where the row's loads and outputs are
//!   contiguous and aligned (gpt2's cross-entropy, rows of 50304: 1.42 to 0.97 ms in bf16).
//! - **Columns** (the innermost axis is kept: a bias gradient): block `(X, Y)`; thread `x` takes
//!   a row (consecutive rows are consecutive in memory, so loads coalesce), threads `y` stride
//!   over the row's reduced elements, and the `Y` partials are combined through shared memory.
//!   X is 32, or 16 or 8 when that leaves too few blocks to fill the GPU; X·Y is 256, or 1024
//!   when blocks are few. A column reduction that still leaves the GPU idle (fewer than two
//!   blocks an SM, rows of 2048 terms or more) runs as two kernels ([`fused_program`],
//!   [`crate::fused::split`]): partial sums over slices of its rows into a scratch the planner
//!   gives the node, then their fold.
//!
//! A thread whose share of a row holds more than 1024 terms of a float sum adds them in blocks
//! of 1024, each block's sum into a second accumulator that moves into the thread's total every
//! 1024 blocks, so that f32 sums stay accurate at any length (the threads' partials are then
//! combined by shuffles and shared memory as above); shorter shares keep the plain loop. Float
//! `max`/`min` and the running max of a reduction propagate NaN (the prelude's `ig_max`,
//! `ig_min`, `ig_keep_max`; `fmaxf`/`fminf` would drop it).
//!
//! Grids are capped (132 · 32 blocks for elementwise loops, 2^20 for rows and columns); the
//! kernels loop over the rest, so any size runs.
//! Every size and stride is a literal in the source (divisions by constants become
//! multiply-shifts), and index arithmetic is 32-bit unsigned when every extent is below 2^31,
//! 64-bit otherwise. Generation is deterministic: the same description gives byte-identical text.

pub mod attention;
pub mod depthwise;
mod emit;
mod fused;
mod guard;
mod kernel;
pub mod ops;
pub mod scatter;
pub mod window;

pub use kernel::{
    CodegenError, CudaKernel, FusedArg, FusedLaunch, FusedProgram, Launch, Strategy, Tuning,
};
pub use ops::{concat, dropout, gather};
pub use scatter::{scatter_add_program, scatter_add_scratch_bytes, ScatterAdd};

// The text helpers, for the generators that name them through this module.
pub(crate) use emit::{
    c_type, finish, grid_for, literal, narrowed, reads, reg_size, reg_type, rounded, signature,
    widened, writes, Ix, Src, BLOCK, MAX_GRID_ELEMENTWISE, MAX_GRID_ROWS,
};

use crate::fused::{FusedKernel, KernelError};

/// Generates the CUDA kernel of a fused-kernel description. Checks it first
/// ([`FusedKernel::check`]); an invalid description gives [`CodegenError::Invalid`].
pub fn fused(k: &FusedKernel) -> Result<CudaKernel, CodegenError> {
    fused::generate(k)
}

/// Scratch bytes of a split's partials, each 256-byte aligned as the planner aligns buffers:
/// `(offset, bytes)` of each of the partial kernel's outputs that is scratch.
fn scratch_layout(s: &crate::fused::split::Split) -> (Vec<Option<(usize, usize)>>, usize) {
    let mut at = 0usize;
    let mut places = Vec::new();
    for (j, o) in s.partial_outputs.iter().enumerate() {
        if *o == crate::fused::split::SplitOutput::Scratch {
            let bytes = s.partial.output_len(j) * s.partial.output_dtype(j).size();
            places.push(Some((at, bytes)));
            at += bytes.next_multiple_of(256);
        } else {
            places.push(None);
        }
    }
    (places, at)
}

/// The split [`fused_program`] runs `k` as, if any.
fn split_of(k: &FusedKernel) -> Option<crate::fused::split::Split> {
    let (axis, ways) = fused::split_ways(k)?;
    crate::fused::split::split(k, axis, ways)
}

/// The split by stages [`fused_program`] runs `k` as, if any (where it is not split as a
/// column reduction).
fn staged_of(k: &FusedKernel) -> Option<crate::fused::staged::Staged> {
    let (axis, ways) = fused::staged_ways(k)?;
    crate::fused::staged::staged(k, axis, ways)
}

/// The reduce axis and the number of slices [`fused_program`] splits `k` by stages along
/// ([`crate::fused::staged`]), or `None` where it runs `k` as one kernel or as a column
/// reduction's two.
pub fn staged_split(k: &FusedKernel) -> Option<(usize, usize)> {
    staged_of(k).and(fused::staged_ways(k))
}

/// Where each scratch buffer of a split by stages lies, each 256-byte aligned as the planner
/// aligns buffers: `(offset, bytes)` of each, and the bytes of them all.
fn staged_layout(s: &crate::fused::staged::Staged) -> (Vec<(usize, usize)>, usize) {
    let mut at = 0usize;
    let mut places = Vec::new();
    for b in &s.scratch {
        let bytes = b.len * b.dtype.size();
        places.push((at, bytes));
        at += bytes.next_multiple_of(256);
    }
    (places, at)
}

/// The launches of a split by stages: each pass in order, its scratch buffers at their places.
fn staged_program(s: &crate::fused::staged::Staged) -> Result<FusedProgram, CodegenError> {
    use crate::fused::staged::Buffer;
    let (places, scratch_bytes) = staged_layout(s);
    let arg = |b: &Buffer| match *b {
        Buffer::Input(n) => FusedArg::Input(n),
        Buffer::Output(j) => FusedArg::Output(j),
        Buffer::Scratch(i) => FusedArg::Scratch {
            offset: places[i].0,
            bytes: places[i].1,
        },
    };
    let launches = (s.passes.iter())
        .map(|p| {
            Ok(FusedLaunch {
                kernel: fused(&p.kernel)?,
                args: p.inputs.iter().chain(&p.outputs).map(arg).collect(),
                reads: p.inputs.len(),
            })
        })
        .collect::<Result<Vec<_>, CodegenError>>()?;
    Ok(FusedProgram {
        launches,
        scratch_bytes,
    })
}

/// Scratch bytes [`fused_program`] needs for `k` (0 for one launch), without generating text:
/// what the planner gives the node as its workspace.
pub fn fused_scratch_bytes(k: &FusedKernel) -> usize {
    match split_of(k) {
        Some(s) => scratch_layout(&s).1,
        None => staged_of(k).map_or(0, |s| staged_layout(&s).1),
    }
}

/// The launches that compute `k` on the GPU (see [`FusedProgram`]). Checks `k` first.
pub fn fused_program(k: &FusedKernel) -> Result<FusedProgram, CodegenError> {
    use crate::fused::split::{FinishInput, SplitOutput};
    k.check()?;
    let Some(s) = split_of(k) else {
        if let Some(s) = staged_of(k) {
            return staged_program(&s);
        }
        return Ok(FusedProgram::one(
            fused(k)?,
            k.inputs.len(),
            k.outputs.len(),
        ));
    };
    let (places, scratch_bytes) = scratch_layout(&s);
    let scratch = |j: usize| {
        places[j]
            .map(|(offset, bytes)| FusedArg::Scratch { offset, bytes })
            .ok_or(CodegenError::Invalid(KernelError::Internal(
                "a split's partial has no place in the scratch",
            )))
    };
    let mut partial_args: Vec<FusedArg> = (0..k.inputs.len()).map(FusedArg::Input).collect();
    for (j, o) in s.partial_outputs.iter().enumerate() {
        partial_args.push(match *o {
            SplitOutput::Scratch => scratch(j)?,
            SplitOutput::Original(t) => FusedArg::Output(t),
        });
    }
    let mut finish_args = Vec::new();
    for f in &s.finish_inputs {
        finish_args.push(match *f {
            FinishInput::Partial(j) => scratch(j)?,
            FinishInput::Original(n) => FusedArg::Input(n),
        });
    }
    finish_args.extend(s.finish_outputs.iter().map(|&j| FusedArg::Output(j)));
    Ok(FusedProgram {
        launches: vec![
            FusedLaunch {
                kernel: fused(&s.partial)?,
                args: partial_args,
                reads: k.inputs.len(),
            },
            FusedLaunch {
                kernel: fused(&s.finish)?,
                args: finish_args,
                reads: s.finish_inputs.len(),
            },
        ],
        scratch_bytes,
    })
}

/// [`fused`] with some choices forced (see [`Tuning`]).
#[doc(hidden)]
pub fn fused_tuned(k: &FusedKernel, tuning: Tuning) -> Result<CudaKernel, CodegenError> {
    fused::generate_tuned(k, tuning)
}

/// The strategy [`fused`] uses for `k` (checks `k` first).
pub fn strategy(k: &FusedKernel) -> Result<Strategy, CodegenError> {
    fused::strategy(k)
}

/// Helpers shared by every kernel: wrapping integer arithmetic, NaN-aware max/min, Rust-`as`
/// conversions, and warp reductions. A module's source is this followed by the kernels' sources.
pub const PRELUDE: &str = r#"// Ingot CUDA prelude: helpers shared by every generated kernel.
// Integer arithmetic wraps (two's complement), as the IR defines it.
__device__ __forceinline__ float ig_add(float a, float b) { return a + b; }
__device__ __forceinline__ double ig_add(double a, double b) { return a + b; }
__device__ __forceinline__ int ig_add(int a, int b) { return (int)((unsigned)a + (unsigned)b); }
__device__ __forceinline__ long long ig_add(long long a, long long b) { return (long long)((unsigned long long)a + (unsigned long long)b); }
__device__ __forceinline__ int ig_sub(int a, int b) { return (int)((unsigned)a - (unsigned)b); }
__device__ __forceinline__ long long ig_sub(long long a, long long b) { return (long long)((unsigned long long)a - (unsigned long long)b); }
__device__ __forceinline__ int ig_mul(int a, int b) { return (int)((unsigned)a * (unsigned)b); }
__device__ __forceinline__ long long ig_mul(long long a, long long b) { return (long long)((unsigned long long)a * (unsigned long long)b); }
__device__ __forceinline__ int ig_neg(int a) { return (int)(0u - (unsigned)a); }
__device__ __forceinline__ long long ig_neg(long long a) { return (long long)(0ull - (unsigned long long)a); }
__device__ __forceinline__ int ig_max(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ long long ig_max(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ int ig_min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ long long ig_min(long long a, long long b) { return a < b ? a : b; }
// Float max and min propagate NaN, as PyTorch's maximum/minimum and XLA do (fmaxf and fminf
// return the other operand).
__device__ __forceinline__ float ig_max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
__device__ __forceinline__ double ig_max(double a, double b) { return (a != a || b != b) ? a + b : fmax(a, b); }
__device__ __forceinline__ float ig_min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
__device__ __forceinline__ double ig_min(double a, double b) { return (a != a || b != b) ? a + b : fmin(a, b); }
// The running max of a reduction: a term replaces it when strictly greater or NaN, so NaN
// propagates (a NaN running max stays: nothing compares greater).
template <typename T> __device__ __forceinline__ T ig_keep_max(T m, T t) { return (t > m || t != t) ? t : m; }
// Conversions as Rust's `as`: float to integer truncates and saturates, NaN gives 0 (the
// conversion instructions saturate, but give the lowest value for NaN in 64 bits); to bool is
// "nonzero"; bool reads as 0 or 1.
__device__ __forceinline__ float ig_to_f32(float x) { return x; }
__device__ __forceinline__ float ig_to_f32(double x) { return (float)x; }
__device__ __forceinline__ float ig_to_f32(int x) { return (float)x; }
__device__ __forceinline__ float ig_to_f32(long long x) { return (float)x; }
__device__ __forceinline__ float ig_to_f32(unsigned char x) { return x != 0 ? 1.0f : 0.0f; }
__device__ __forceinline__ double ig_to_f64(float x) { return (double)x; }
__device__ __forceinline__ double ig_to_f64(double x) { return x; }
__device__ __forceinline__ double ig_to_f64(int x) { return (double)x; }
__device__ __forceinline__ double ig_to_f64(long long x) { return (double)x; }
__device__ __forceinline__ double ig_to_f64(unsigned char x) { return x != 0 ? 1.0 : 0.0; }
__device__ __forceinline__ int ig_to_i32(float x) { return x != x ? 0 : __float2int_rz(x); }
__device__ __forceinline__ int ig_to_i32(double x) { return x != x ? 0 : __double2int_rz(x); }
__device__ __forceinline__ int ig_to_i32(int x) { return x; }
__device__ __forceinline__ int ig_to_i32(long long x) { return (int)(unsigned)(unsigned long long)x; }
__device__ __forceinline__ int ig_to_i32(unsigned char x) { return x != 0 ? 1 : 0; }
__device__ __forceinline__ long long ig_to_i64(float x) { return x != x ? 0ll : __float2ll_rz(x); }
__device__ __forceinline__ long long ig_to_i64(double x) { return x != x ? 0ll : __double2ll_rz(x); }
__device__ __forceinline__ long long ig_to_i64(int x) { return (long long)x; }
__device__ __forceinline__ long long ig_to_i64(long long x) { return x; }
__device__ __forceinline__ long long ig_to_i64(unsigned char x) { return x != 0 ? 1ll : 0ll; }
template <typename T> __device__ __forceinline__ unsigned char ig_to_bool(T x) { return x != 0 ? 1 : 0; }
// Reductions across `width` lanes (a power of two up to 32, aligned groups of a warp) by
// butterfly: every lane of the group gets the group's result. Every lane of the warp must call.
template <typename T> __device__ __forceinline__ T ig_lanes_sum(T v, int width) {
#pragma unroll
  for (int o = width >> 1; o > 0; o >>= 1) v = ig_add(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename T> __device__ __forceinline__ T ig_lanes_max(T v, int width) {
#pragma unroll
  for (int o = width >> 1; o > 0; o >>= 1) v = ig_keep_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
"#;

/// The helpers of bf16 kernels (see the module docs, "bf16"), placed after [`PRELUDE`] in a
/// module that holds one ([`prelude_for`]), so that modules without bf16 are as they were.
pub const PRELUDE_BF16: &str = r#"// bf16 (see the module docs on bf16): memory holds the 16 bits (`unsigned short`), a register
// holds the float the value widens to. `ig_bf16_bits` rounds to the nearest bf16, ties to even,
// and a NaN keeps its sign and high mantissa bits with the quiet bit set, exactly as the host's
// `half::bf16::from_f32`; `ig_round` is that rounding widened back to a float (what every
// bf16-typed instruction's result goes through); `ig_narrow` stores an already rounded float.
__device__ __forceinline__ unsigned short ig_bf16_bits(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // The hardware's round to nearest even: the same bits for every non-NaN float, subnormals
  // included, in one instruction instead of five.
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
#else
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
__device__ __forceinline__ float ig_widen(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
__device__ __forceinline__ float ig_round(float f) { return ig_widen(ig_bf16_bits(f)); }
__device__ __forceinline__ unsigned short ig_narrow(float f) { return (unsigned short)(__float_as_uint(f) >> 16); }
// Conversions to bf16 (a rounded float): from a double rounded once, through a float rounded
// to odd (truncated toward zero, its last bit set when anything was dropped), as the host's
// `bf16_from_f64`; integers through double, as the host does; bool to 0 or 1.
__device__ __forceinline__ float ig_to_bf16(float x) { return ig_round(x); }
__device__ __forceinline__ float ig_to_bf16(double x) {
  const float f = (float)x;
  if (x != x || (double)f == x) return ig_round(f);
  unsigned b = __float_as_uint(f);
  if (fabs((double)f) > fabs(x)) b -= 1u;
  return ig_round(__uint_as_float(b | 1u));
}
__device__ __forceinline__ float ig_to_bf16(int x) { return ig_to_bf16((double)x); }
__device__ __forceinline__ float ig_to_bf16(long long x) { return ig_to_bf16((double)x); }
__device__ __forceinline__ float ig_to_bf16(unsigned char x) { return x != 0 ? 1.0f : 0.0f; }
// f32 division in a kernel holding bf16: full range (subnormals, infinities and NaN as IEEE
// division gives them), at most 2 ulp from the correctly rounded quotient. (Compiled for a host,
// as the tests that run generated kernels on the CPU do, it is the host's division.)
__device__ __forceinline__ float ig_fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  float q; asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b)); return q;
#else
  return a / b;
#endif
}
// The hardware's 2^x approximation (`ex2.approx.f32`: subnormal results kept); on the host,
// exp2f.
__device__ __forceinline__ float ig_exp2_approx(float x) {
#ifdef __CUDA_ARCH__
  float y; asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
#else
  return exp2f(x);
#endif
}
// exp in a kernel holding bf16 (`ig_exp`): 2^{x log2(e)} by `ex2.approx.f32` (2 ulp from
// 2^ of the rounded product, subnormal results kept), whose product's rounding adds a relative
// error of at most (1 + |x|) 2^-23: 1e-6 at |x| = 16, where a softmax's or a cross-entropy's terms
// exp(x - max) that matter lie, far below the bf16 rounding around it. CUDA's `expf` (a range
// reduction by two multiply-adds, then the same instruction and a scaling) made the
// cross-entropy's bf16 kernel, two exponentials an element, bound by instructions (gpt2:
// 1.7 TB/s, session 34; 958.7 -> 852.1 us with ig_exp, session 41). Overflows to inf from x = 88.7228 (the rounded product reaching 128),
// where e^x is within 2e-5 of f32's largest; NaN, +-inf as exp gives them. On the host
// (`ig_exp`), the host's expf; `ig_exp_formula` is what the device runs.
__device__ __forceinline__ float ig_exp_formula(float x) { return ig_exp2_approx(x * 1.4426950408889634f); }
__device__ __forceinline__ float ig_exp(float x) {
#ifdef __CUDA_ARCH__
  return ig_exp_formula(x);
#else
  return expf(x);
#endif
}
"#;

/// The prelude of a module holding `kernels`: [`PRELUDE`], and [`PRELUDE_BF16`] if a kernel
/// uses its helpers.
pub fn prelude_for<'a>(kernels: impl IntoIterator<Item = &'a CudaKernel>) -> String {
    let mut s = String::from(PRELUDE);
    if kernels.into_iter().any(|k| uses_bf16(&k.source)) {
        s.push_str(PRELUDE_BF16);
    }
    s
}

/// Whether a kernel's text calls a helper of [`PRELUDE_BF16`].
fn uses_bf16(source: &str) -> bool {
    [
        "ig_bf16_bits(",
        "ig_widen(",
        "ig_round(",
        "ig_narrow(",
        "ig_to_bf16(",
        "ig_fdiv(",
        "ig_exp(",
    ]
    .iter()
    .any(|h| source.contains(h))
}
