// What skipping the causal half of plain attention's six batched GEMMs would buy, and what
// reading Q, K and V in place from the qkv projection would, measured with cuBLAS before either
// is built into the lowering. Timing only (random bf16 operands; no result is checked).
//
//   nvcc -O3 -arch=sm_90 -o causal_gemm causal_gemm.cu -lcublas && ./causal_gemm
//
// Shapes are gpt2's at batch 8: 96 (batch x head) matrices of T = 1024 rows, head size D = 64.
// Each row-major GEMM is written as cuBLAS's column-major one of the transposes. "blocks B"
// cuts the rows of the causal operand or result into B blocks and gives each block only the
// columns at or below the diagonal: (B - 1) / 2B of the work and bytes are left out.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>

#define CK(x) do { auto e = (x); if ((int)e != 0) { printf("error %d at %s:%d\n", (int)e, __FILE__, __LINE__); exit(1); } } while (0)

static const int T = 1024, D = 64, NB = 8, H = 12, BATCH = NB * H;
static cublasHandle_t h;
static const float one = 1.f, zero = 0.f;

static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a,
                 int lda, long long sa, const void* b, int ldb, long long sb, void* c, int ldc,
                 long long sc) {
  CK(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, sa, b, CUDA_R_16BF,
                                ldb, sb, &zero, c, CUDA_R_16BF, ldc, sc, BATCH, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
}

typedef __nv_bfloat16 bf;
static bf *Q, *K, *V, *dO, *S, *P, *O, *dV, *qkv;
static const long long sTD = (long long)T * D, sTT = (long long)T * T;
static const cublasOperation_t N_ = CUBLAS_OP_N, T_ = CUBLAS_OP_T;

// Rows [r0, r1) of each product; the full product is (0, T).
// S = Q K^T, needed at or below the diagonal: col-major S^T[j, i] = K Q^T, j < r1.
static void scores(int r0, int r1) {
  gemm(T_, N_, r1, r1 - r0, D, K, D, sTD, Q + (long long)r0 * D, D, sTD, S + (long long)r0 * T, T, sTT);
}
// O = P V with P zero above the diagonal: O^T[:, i] = V^T P^T[:, i], over j < r1.
static void pv(int r0, int r1) {
  gemm(N_, N_, D, r1 - r0, r1, V, D, sTD, P + (long long)r0 * T, T, sTT, O + (long long)r0 * D, D, sTD);
}
// dV = P^T dO: dV[j] sums over i >= j, so the block of rows j in [r0, r1) reads rows i >= r0.
static void pt_do(int r0, int r1) {
  gemm(N_, T_, D, r1 - r0, T - r0, dO + (long long)r0 * D, D, sTD, P + (long long)r0 * T + r0, T, sTT,
       dV + (long long)r0 * D, D, sTD);
}

// Microseconds a call of `run`: 3 calls to warm, then `reps` timed.
template <class F> static float time_calls(F run, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 3; i++) run();
  cudaEventRecord(a);
  for (int i = 0; i < reps; i++) run();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.f / reps;
}
typedef void (*Block)(int, int);
static float time_it(Block f, int blocks, int reps) {
  return time_calls([&] {
    for (int i = 0; i < blocks; i++) f(T * i / blocks, T * (i + 1) / blocks);
  }, reps);
}

// Q K^T read from the qkv projection in place ([NB, T, 3, H, D] row-major): one call per
// sequence (batch H, stride D, leading dimension 3 H D), or one call over pointer arrays.
static float in_place(bool pointers, int reps) {
  const int ld = 3 * H * D;
  std::vector<const void*> a(BATCH), b(BATCH);
  std::vector<void*> c(BATCH);
  for (int n = 0; n < NB; n++)
    for (int hh = 0; hh < H; hh++) {
      int i = n * H + hh;
      a[i] = qkv + (long long)n * T * ld + H * D + hh * D;  // K
      b[i] = qkv + (long long)n * T * ld + hh * D;          // Q
      c[i] = S + (long long)i * sTT;
    }
  const void **da, **db; void** dc;
  CK(cudaMalloc(&da, BATCH * 8)); CK(cudaMalloc(&db, BATCH * 8)); CK(cudaMalloc(&dc, BATCH * 8));
  cudaMemcpy(da, a.data(), BATCH * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), BATCH * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(dc, c.data(), BATCH * 8, cudaMemcpyHostToDevice);
  auto run = [&] {
    if (pointers) {
      CK(cublasGemmBatchedEx(h, T_, N_, T, T, D, &one, da, CUDA_R_16BF, ld, db, CUDA_R_16BF, ld, &zero,
                             dc, CUDA_R_16BF, T, BATCH, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      for (int n = 0; n < NB; n++)
        CK(cublasGemmStridedBatchedEx(h, T_, N_, T, T, D, &one, a[n * H], CUDA_R_16BF, ld, D, b[n * H],
                                      CUDA_R_16BF, ld, D, &zero, c[n * H], CUDA_R_16BF, T, sTT, H,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  };
  return time_calls(run, reps);
}

int main() {
  CK(cublasCreate(&h));
  void* ws; CK(cudaMalloc(&ws, 32 << 20)); CK(cublasSetWorkspace(h, ws, 32 << 20));
  size_t td = (size_t)BATCH * T * D * 2, tt = (size_t)BATCH * T * T * 2;
  for (bf** p : {&Q, &K, &V, &dO, &O, &dV}) CK(cudaMalloc(p, td));
  CK(cudaMalloc(&S, tt)); CK(cudaMalloc(&P, tt)); CK(cudaMalloc(&qkv, 3 * td));
  for (bf* p : {Q, K, V, dO, O, dV}) cudaMemset(p, 0x3c, td);
  cudaMemset(S, 0x3c, tt); cudaMemset(P, 0x3c, tt); cudaMemset(qkv, 0x3c, 3 * td);
  const int reps = 50;
  struct { const char* name; Block f; } gemms[] = {
      {"S = Q K^T   (also dP = dO V^T)", scores},
      {"O = P V     (also dQ = dS K)", pv},
      {"dV = P^T dO (also dK = dS^T Q)", pt_do},
  };
  for (auto& g : gemms) {
    float full = time_it(g.f, 1, reps);
    printf("%-32s full %7.1f us", g.name, full);
    for (int b : {2, 4, 8, 16}) {
      float t = time_it(g.f, b, reps);
      printf(" | %2d blocks %7.1f us (%.3fx)", b, t, t / full);
    }
    printf("\n");
  }
  printf("S = Q K^T from contiguous Q, K: %7.1f us\n", time_it(scores, 1, reps));
  printf("S = Q K^T from qkv in place, 8 calls of 12: %7.1f us\n", in_place(false, reps));
  printf("S = Q K^T from qkv in place, pointer arrays: %7.1f us\n", in_place(true, reps));
  return 0;
}
