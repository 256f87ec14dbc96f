// gpt2's bf16 plain-attention softmax kernels as ingot generated them at 37d598d (the
// forward and the backward; the names changed to fwd_v0 and bwd_v0).
// Lines each kernel computes again in a later pass, written once (the generated kernels
// repeat them): the forward's masked, scaled score %7 of an element (from %0 and %2) and its
// exponential %10; the backward's probability %13 (from %0 and %3) and its gradient %16.
#define FWD_SCORE \
      const float v3 = ig_to_f32(v2); \
      const float v5 = v3 * v4; \
      const float v6 = v0 ? v1 : v5; \
      const float v7 = ig_to_f32(v6);
#define FWD_EXP \
      FWD_SCORE \
      const float v9 = v7 - v8; \
      const float v10 = expf(v9);
#define BWD_PROB \
      const float v4 = ig_to_f32(v3); \
      const float v6 = v4 * v5; \
      const float v7 = v0 ? v2 : v6; \
      const float v8 = ig_to_f32(v7); \
      const float v10 = v8 - v9; \
      const float v11 = expf(v10); \
      const float v13 = v11 / v12;
#define BWD_DP \
      const float v15 = ig_to_f32(v14); \
      const float v16 = ig_to_f32(v15);
// ingot fused kernel (rows): domain [8,12,1024,1024], reduce axes [3]; 98304 rows of 1024 elements; 2 reduction passes, then the outputs
// launch: grid [98304,1,1], block [128,1,1]
extern "C" __global__ void __launch_bounds__(128) fwd_v0(const unsigned char* in0, const unsigned short* in1, float* out0, float* out1, unsigned short* out2) {
  __shared__ float sm8[4];
  __shared__ float sm11[4];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  for (unsigned row = blockIdx.x; row < 98304u; row += gridDim.x) {
    const unsigned i2 = row % 1024u;
    const unsigned b0 = 1024u * i2;
    const unsigned b1 = 1024u * row;
    const unsigned bo = 1024u * row;
    unsigned char c0[8]; // %0, kept for the later passes
    float c2[8]; // %2, kept for the later passes
    const float v1 = __int_as_float((int)0xff800000u);
    const float v4 = 0.125f;
    // pass 1: %8
    float a8 = __int_as_float((int)0xff800000u);
    #pragma unroll
    for (unsigned u = 0u; u < 8u; ++u) {
      const unsigned j = threadIdx.x + u * 128u;
      const unsigned char v0 = in0[b0 + j];
      c0[u] = v0;
      const float v2 = v0 ? 0.0f : ig_widen(in1[b1 + j]);
      c2[u] = v2;
      FWD_SCORE
      a8 = ig_keep_max(a8, v7);
    }
    IG_BLOCK_MAX(a8, sm8, 4u)
    const float v8 = a8;
    // pass 2: %11
    float a11 = 0.0f;
    #pragma unroll
    for (unsigned u = 0u; u < 8u; ++u) {
      const unsigned char v0 = c0[u];
      const float v2 = c2[u];
      FWD_EXP
      a11 = a11 + v10;
    }
    IG_BLOCK_SUM(a11, sm11, 4u)
    const float v11 = a11;
    // the full outputs
    #pragma unroll
    for (unsigned u = 0u; u < 8u; ++u) {
      const unsigned j = threadIdx.x + u * 128u;
      const unsigned char v0 = c0[u];
      const float v2 = c2[u];
      FWD_EXP
      const float v12 = v10 / v11;
      const float v13 = ig_to_bf16(v12);
      out2[bo + j] = ig_narrow(v13);
    }
    if (threadIdx.x == 0u) { out0[row] = v8; out1[row] = v11; }
  }
}

// ingot fused kernel (rows): domain [8,12,1024,1024], reduce axes [3]; 98304 rows of 1024 elements; 1 reduction pass, then the outputs
// launch: grid [98304,1,1], block [256,1,1]
extern "C" __global__ void __launch_bounds__(256) bwd_v0(const unsigned char* in0, const unsigned short* in1, const float* in2, const float* in3, const unsigned short* in4, unsigned short* out0) {
  __shared__ float sm18[8];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  for (unsigned row = blockIdx.x; row < 98304u; row += gridDim.x) {
    const unsigned i2 = row % 1024u;
    const unsigned b0 = 1024u * i2;
    const unsigned b1 = 1024u * row;
    const unsigned b2 = row;
    const unsigned b3 = row;
    const unsigned b4 = 1024u * row;
    const unsigned bo = 1024u * row;
    unsigned char c0[4]; // %0, kept for the later passes
    float c3[4]; // %3, kept for the later passes
    float c14[4]; // %14, kept for the later passes
    const float v1 = 0.0f;
    const float v2 = __int_as_float((int)0xff800000u);
    const float v5 = 0.125f;
    const float v9 = in2[b2];
    const float v12 = in3[b3];
    // pass 1: %18
    float a18 = 0.0f;
    #pragma unroll
    for (unsigned u = 0u; u < 4u; ++u) {
      const unsigned j = threadIdx.x + u * 256u;
      const unsigned char v0 = in0[b0 + j];
      c0[u] = v0;
      const float v3 = v0 ? 0.0f : ig_widen(in1[b1 + j]);
      c3[u] = v3;
      BWD_PROB
      const float v14 = ig_widen(in4[b4 + j]);
      c14[u] = v14;
      BWD_DP
      const float v17 = v16 * v13;
      a18 = a18 + v17;
    }
    IG_BLOCK_SUM(a18, sm18, 8u)
    const float v18 = a18;
    // the full outputs
    #pragma unroll
    for (unsigned u = 0u; u < 4u; ++u) {
      const unsigned j = threadIdx.x + u * 256u;
      const unsigned char v0 = c0[u];
      const float v3 = c3[u];
      BWD_PROB
      const float v14 = c14[u];
      BWD_DP
      const float v19 = v16 - v18;
      const float v20 = v13 * v19;
      const float v21 = ig_to_bf16(v20);
      const float v22 = ig_to_f32(v21);
      const float v23 = v0 ? v1 : v22;
      const float v24 = v23 * v5;
      const float v25 = ig_to_bf16(v24);
      out0[bo + j] = ig_narrow(v25);
    }
  }
}
