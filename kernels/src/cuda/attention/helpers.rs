//! The device helpers every attention kernel's text starts with: the tensor-core instructions
//! (inline PTX), the per-warp tile products built on them (and their f32 FMA twin), the tile
//! loader and the row reductions.
//!
//! Each group sits behind an include guard (`#ifndef INGOT_FA_…`), so a module holding several
//! attention kernels (forward and backward, several shapes) defines each helper once. The
//! instructions are a separate group ([`ASM`]) from the products ([`PRODUCTS`]): a host
//! emulation (kernels/tests/cuda_attention_emu.rs) defines `INGOT_FA_ASM` itself and supplies
//! warp-level emulations of these instructions, and runs everything else as written.
//!
//! # Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k8")
//! A warp's lane is `4 g + t` (`g` = lane / 4, `t` = lane % 4). The accumulator `c[4]` of a
//! 16 × 8 tile holds `(g, 2t)`, `(g, 2t+1)`, `(g+8, 2t)`, `(g+8, 2t+1)`, for both shapes.
//! - bf16 `m16n8k16`: `a[0..4]` hold A's pairs `(g, 2t..2t+1)`, `(g+8, 2t..)`, `(g, 2t+8..)`,
//!   `(g+8, 2t+8..)`, the lower column in the low 16 bits; `b[0..2]` hold B's pairs
//!   `(2t..2t+1, g)` and `(2t+8..2t+9, g)`, the lower k in the low half.
//! - tf32 `m16n8k8`: `a[0..4]` hold `(g, t)`, `(g+8, t)`, `(g, t+4)`, `(g+8, t+4)`; `b[0..2]`
//!   hold `(t, g)` and `(t+4, g)`.
//!
//! bf16 tiles streamed through shared memory arrive by `cp.async` (`ig_fa_load_async`), issued
//! a product ahead of their readers (see `frame::streamed_pipelined`).
//!
//! bf16 operands are loaded with `ldmatrix` (`.trans` for a "kn" B); tf32 tiles are rounded to
//! tf32 when they are written to shared memory, so the products read them as they are.
//!
//! The f32 products compute the same accumulator layout with one FMA a term, k ascending, so
//! the three precisions share one kernel text around the product calls.

/// The tensor-core instructions and the f32 → tf32 conversion (round to nearest, ties away).
pub(crate) const ASM: &str = r#"#ifndef INGOT_FA_ASM
#define INGOT_FA_ASM
__device__ __forceinline__ void ig_fa_mma_bf16(float* c, const unsigned* a, const unsigned* b) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void ig_fa_mma_tf32(float* c, const unsigned* a, const unsigned* b) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ unsigned ig_fa_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
// Four 8 x 8 bf16 matrices from shared memory, lane l addressing row l % 8 of matrix l / 8;
// lane l gets (row l / 4, columns 2 (l % 4), + 1) of each (`_t`: of each transposed).
__device__ __forceinline__ void ig_fa_ldsm4(unsigned* r, const unsigned short* p) {
  asm volatile("{\n .reg .u64 a;\n cvta.to.shared.u64 a, %4;\n ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [a];\n}\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p) : "memory");
}
__device__ __forceinline__ void ig_fa_ldsm4_t(unsigned* r, const unsigned short* p) {
  asm volatile("{\n .reg .u64 a;\n cvta.to.shared.u64 a, %4;\n ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [a];\n}\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p) : "memory");
}
// 16 bytes from global `src` to shared `dst` without a register (`cp.async`, sm_80 on; a plain
// copy before): `valid` false fills them with zeros and reads nothing. The copies of a group
// (`ig_fa_cp_commit`) land by `ig_fa_cp_wait<N>` (all but the newest N groups); a barrier
// after it makes them visible to the block.
__device__ __forceinline__ void ig_fa_cp16(void* dst, const void* src, bool valid) {
#if __CUDA_ARCH__ >= 800
  asm volatile("{\n .reg .u64 a;\n cvta.to.shared.u64 a, %0;\n cp.async.cg.shared.global [a], [%1], 16, %2;\n}\n"
               :: "l"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
#else
  *(uint4*)dst = valid ? *(const uint4*)src : make_uint4(0u, 0u, 0u, 0u);
#endif
}
__device__ __forceinline__ void ig_fa_cp_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void ig_fa_cp_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
#endif
}
#endif
"#;

/// Per-warp tile products, the tile loader and the quad reductions.
///
/// `ig_fa_mm_{nk,kn}_{bf16,tf32,f32}<NT, K, LDA, LDB>(c, a, b, g, t)`: one warp's
/// `C[16 × 8·NT] += A[16 × K] · B[K × 8·NT]`, A row-major in shared memory at `a` (row stride
/// `LDA`), B in shared memory at `b` either "nk" (`B[k][n] = b[n·LDB + k]`: the rows of `b`
/// are B's columns, as K's rows are the columns of Kᵀ) or "kn" (`B[k][n] = b[k·LDB + n]`).
/// `c[n]` is the accumulator of the `n`th 16 × 8 tile.
pub(crate) const PRODUCTS: &str = r#"#ifndef INGOT_FA_PRODUCTS
#define INGOT_FA_PRODUCTS
__device__ __forceinline__ unsigned ig_fa_u32(const unsigned short* p) { return *(const unsigned*)p; }
// Two bf16 of one column, `stride` elements apart, as a pair (the first in the low half).
__device__ __forceinline__ unsigned ig_fa_col2(const unsigned short* p, int stride) {
  return (unsigned)p[0] | ((unsigned)p[stride] << 16);
}
// bf16 operands come in by ldmatrix: A's 16 x 16 step as four matrices (rows 0-7 and 8-15 at
// columns kk and kk + 8), B's two 8-column tiles a step as four more (transposed for "kn").
template <int NT, int K, int LDA, int LDB>
__device__ __forceinline__ void ig_fa_mm_nk_bf16(float (*c)[4], const unsigned short* a, const unsigned short* b, int g, int t) {
  const int lane = 4 * g + t;
  const unsigned short* ap = a + (lane & 15) * LDA + (lane >> 4) * 8;
  const unsigned short* bp = b + ((lane & 7) + ((lane >> 4) << 3)) * LDB + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < K; kk += 16) {
    unsigned af[4];
    ig_fa_ldsm4(af, ap + kk);
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      unsigned bf[4];
      ig_fa_ldsm4(bf, bp + n * 8 * LDB + kk);
      ig_fa_mma_bf16(c[n], af, bf);
      ig_fa_mma_bf16(c[n + 1], af, bf + 2);
    }
  }
}
template <int NT, int K, int LDA, int LDB>
__device__ __forceinline__ void ig_fa_mm_kn_bf16(float (*c)[4], const unsigned short* a, const unsigned short* b, int g, int t) {
  const int lane = 4 * g + t;
  const unsigned short* ap = a + (lane & 15) * LDA + (lane >> 4) * 8;
  const unsigned short* bp = b + ((lane & 7) + (((lane >> 3) & 1) << 3)) * LDB + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < K; kk += 16) {
    unsigned af[4];
    ig_fa_ldsm4(af, ap + kk);
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      unsigned bf[4];
      ig_fa_ldsm4_t(bf, bp + kk * LDB + n * 8);
      ig_fa_mma_bf16(c[n], af, bf);
      ig_fa_mma_bf16(c[n + 1], af, bf + 2);
    }
  }
}
template <int NT, int K, int LDA, int LDB>
__device__ __forceinline__ void ig_fa_mm_nk_tf32(float (*c)[4], const float* a, const float* b, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < K; kk += 8) {
    unsigned af[4];
    af[0] = __float_as_uint(a[g * LDA + kk + t]);
    af[1] = __float_as_uint(a[(g + 8) * LDA + kk + t]);
    af[2] = __float_as_uint(a[g * LDA + kk + t + 4]);
    af[3] = __float_as_uint(a[(g + 8) * LDA + kk + t + 4]);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      unsigned bf[2];
      bf[0] = __float_as_uint(b[(n * 8 + g) * LDB + kk + t]);
      bf[1] = __float_as_uint(b[(n * 8 + g) * LDB + kk + t + 4]);
      ig_fa_mma_tf32(c[n], af, bf);
    }
  }
}
template <int NT, int K, int LDA, int LDB>
__device__ __forceinline__ void ig_fa_mm_kn_tf32(float (*c)[4], const float* a, const float* b, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < K; kk += 8) {
    unsigned af[4];
    af[0] = __float_as_uint(a[g * LDA + kk + t]);
    af[1] = __float_as_uint(a[(g + 8) * LDA + kk + t]);
    af[2] = __float_as_uint(a[g * LDA + kk + t + 4]);
    af[3] = __float_as_uint(a[(g + 8) * LDA + kk + t + 4]);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      unsigned bf[2];
      bf[0] = __float_as_uint(b[(kk + t) * LDB + n * 8 + g]);
      bf[1] = __float_as_uint(b[(kk + t + 4) * LDB + n * 8 + g]);
      ig_fa_mma_tf32(c[n], af, bf);
    }
  }
}
// (tf32 tiles hold values already rounded to tf32 by their loads and stores.)
// Strict f32: one fmaf a term, k ascending, into the accumulator layout of the mma tiles.
template <int NT, int K, int LDA, int LDB>
__device__ __forceinline__ void ig_fa_mm_nk_f32(float (*c)[4], const float* a, const float* b, int g, int t) {
#pragma unroll 2
  for (int kk = 0; kk < K; ++kk) {
    const float a0 = a[g * LDA + kk], a1 = a[(g + 8) * LDA + kk];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float b0 = b[(n * 8 + 2 * t) * LDB + kk], b1 = b[(n * 8 + 2 * t + 1) * LDB + kk];
      c[n][0] = fmaf(a0, b0, c[n][0]);
      c[n][1] = fmaf(a0, b1, c[n][1]);
      c[n][2] = fmaf(a1, b0, c[n][2]);
      c[n][3] = fmaf(a1, b1, c[n][3]);
    }
  }
}
template <int NT, int K, int LDA, int LDB>
__device__ __forceinline__ void ig_fa_mm_kn_f32(float (*c)[4], const float* a, const float* b, int g, int t) {
#pragma unroll 2
  for (int kk = 0; kk < K; ++kk) {
    const float a0 = a[g * LDA + kk], a1 = a[(g + 8) * LDA + kk];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float b0 = b[kk * LDB + n * 8 + 2 * t], b1 = b[kk * LDB + n * 8 + 2 * t + 1];
      c[n][0] = fmaf(a0, b0, c[n][0]);
      c[n][1] = fmaf(a0, b1, c[n][1]);
      c[n][2] = fmaf(a1, b0, c[n][2]);
      c[n][3] = fmaf(a1, b1, c[n][3]);
    }
  }
}
// Rows [row0, row0 + R) of `rows` rows of D elements, RS elements apart from `src` (the
// operand's row stride: the layout's), into shared memory at `dst` (row stride LD elements),
// 16 bytes a thread at a time; rows at or past `rows` read as zeros. TF32: each float rounded
// to tf32 on the way (what the tf32 products read).
template <int R, int D, unsigned long long RS, int LD, int THREADS, bool TF32, typename T>
__device__ __forceinline__ void ig_fa_load(T* dst, const T* src, int row0, int rows) {
  constexpr int V = 16 / (int)sizeof(T);
  constexpr int PER_ROW = D / V;
  constexpr int ITERS = (R * PER_ROW + THREADS - 1) / THREADS;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int i = it * THREADS + (int)threadIdx.x;
    if (R * PER_ROW % THREADS == 0 || i < R * PER_ROW) {
      const int r = i / PER_ROW, col = (i % PER_ROW) * V;
      uint4 x = make_uint4(0u, 0u, 0u, 0u);
      if (row0 + r < rows) x = *(const uint4*)(src + (unsigned long long)(row0 + r) * RS + col);
      if (TF32) {
        x.x = ig_fa_tf32(__uint_as_float(x.x));
        x.y = ig_fa_tf32(__uint_as_float(x.y));
        x.z = ig_fa_tf32(__uint_as_float(x.z));
        x.w = ig_fa_tf32(__uint_as_float(x.w));
      }
      *(uint4*)(dst + r * LD + col) = x;
    }
  }
}
// ig_fa_load without a register between (`ig_fa_cp16`) and without rounding (bf16 and f32
// tiles): the copies are issued, not landed; the caller commits them as a group and waits.
template <int R, int D, unsigned long long RS, int LD, int THREADS, typename T>
__device__ __forceinline__ void ig_fa_load_async(T* dst, const T* src, int row0, int rows) {
  constexpr int V = 16 / (int)sizeof(T);
  constexpr int PER_ROW = D / V;
  constexpr int ITERS = (R * PER_ROW + THREADS - 1) / THREADS;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int i = it * THREADS + (int)threadIdx.x;
    if (R * PER_ROW % THREADS == 0 || i < R * PER_ROW) {
      const int r = i / PER_ROW, col = (i % PER_ROW) * V;
      const bool in = row0 + r < rows;
      // A row past the end reads nothing; its address is the operand's first row's.
      const T* from = in ? src + (unsigned long long)(row0 + r) * RS + col : src;
      ig_fa_cp16(dst + r * LD + col, from, in);
    }
  }
}
// Max and sum over the four lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float ig_fa_quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float ig_fa_quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
#endif
"#;

/// The helpers' text (both groups): what every attention kernel's source begins with.
pub(crate) fn all() -> String {
    format!("{ASM}{PRODUCTS}")
}
