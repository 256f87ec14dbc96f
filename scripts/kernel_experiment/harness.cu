// Times one generated softmax kernel of gpt2's plain attention on synthetic bf16 data, as
// run.sh builds it: the forward (-DFWD: scores in, max, sum and probabilities out) or the
// backward (scores, max, sum and the probabilities' gradient in; probabilities and the
// scores' gradient out). KFILE is the kernel's text after its prelude (kernel_dump --cu),
// KNAME its name, THREADS its block; prints the best of 25 launches after 5 warm-ups.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include KFILE
int main() {
  const size_t rows = 98304, n = 1024, el = rows * n;
  unsigned short *s, *dp, *o0, *o1; float *m, *sum;
  cudaMalloc(&s, el * 2); cudaMalloc(&dp, el * 2); cudaMalloc(&o0, el * 2); cudaMalloc(&o1, el * 2);
  cudaMalloc(&m, rows * 4); cudaMalloc(&sum, rows * 4);
  unsigned short* h = (unsigned short*)malloc(el * 2);
  for (size_t i = 0; i < el; ++i) { float f = ((rand() % 2000) - 1000) / 100.0f; unsigned u; memcpy(&u, &f, 4); h[i] = u >> 16; }
  cudaMemcpy(s, h, el * 2, cudaMemcpyHostToDevice); cudaMemcpy(dp, h, el * 2, cudaMemcpyHostToDevice);
  float* hm = (float*)malloc(rows * 4); for (size_t i = 0; i < rows; ++i) hm[i] = 10.0f;
  cudaMemcpy(m, hm, rows * 4, cudaMemcpyHostToDevice); cudaMemcpy(sum, hm, rows * 4, cudaMemcpyHostToDevice);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  float best = 1e9;
  for (int it = 0; it < 30; ++it) {
    cudaEventRecord(a);
#ifdef FWD
    KNAME<<<98304, THREADS>>>(s, m, sum, o0);
#else
    KNAME<<<98304, THREADS>>>(s, m, sum, dp, o0, o1);
#endif
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); if (it >= 5 && ms < best) best = ms;
  }
  cudaError_t e = cudaGetLastError();
  printf("%s %s: %.1f us%s\n", KLABEL, VARIANT, best * 1000, e ? cudaGetErrorString(e) : "");
  return 0;
}
