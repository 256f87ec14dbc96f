// The helpers every generated kernel uses: the PRELUDE and PRELUDE_BF16 of
// kernels/src/cuda/mod.rs as ingot emitted them at 37d598d (the copy the kernels beside it
// were generated with).
// Ingot CUDA prelude: helpers shared by every generated kernel.
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
// bf16 (see the module docs on bf16): memory holds the 16 bits (`unsigned short`), a register
// holds the float the value widens to. `ig_bf16_bits` rounds to the nearest bf16, ties to even,
// and a NaN keeps its sign and high mantissa bits with the quiet bit set, exactly as the host's
// `half::bf16::from_f32`; `ig_round` is that rounding widened back to a float (what every
// bf16-typed instruction's result goes through); `ig_narrow` stores an already rounded float.
__device__ __forceinline__ unsigned short ig_bf16_bits(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
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

// ---- The microbenchmarks' own, not part of the generated prelude above.
// A block's reduction of `a` through shared `sm` over `W` warps (`lane` and `warp` in scope), as
// the generated row kernels write it: the sum, and the maximum.
#define IG_BLOCK_SUM(a, sm, W) \
    a = ig_lanes_sum(a, 32); \
    if (lane == 0u) { sm[warp] = a; } \
    __syncthreads(); \
    a = sm[0]; \
    for (unsigned w = 1u; w < W; ++w) { a = a + sm[w]; }
#define IG_BLOCK_MAX(a, sm, W) \
    a = ig_lanes_max(a, 32); \
    if (lane == 0u) { sm[warp] = a; } \
    __syncthreads(); \
    a = sm[0]; \
    for (unsigned w = 1u; w < W; ++w) { a = ig_keep_max(a, sm[w]); }
// The host's check of every CUDA call, and `timeit`: a kernel's launch `f` run 3 times to warm,
// then IG_REPS times (define it before the include for other than 20), in microseconds a run.
#include <cstdio>
#include <cstdlib>
#ifndef IG_REPS
#define IG_REPS 20
#endif
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
template <class F> float timeit(F f) { cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); for (int i=0;i<3;++i) f(); cudaEventRecord(a); for (int i=0;i<IG_REPS;++i) f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms,a,b); CK(cudaGetLastError()); return ms*1000/IG_REPS; }
