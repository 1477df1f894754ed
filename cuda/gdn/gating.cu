// GDN gates: g = -exp(A_log) * softplus(a + dt_bias) in fp32, beta = sigmoid(b) rounded to bf16 (HF
// computes it in the model dtype) and widened. a, b [T, Nv] bf16 with row strides (they are usually
// column slices of a projection output); A_log, dt_bias [Nv] fp32 (the wrapper widens bf16 copies);
// g, beta [T, Nv] fp32 contiguous. One thread per (token, head); grid: ceil(T * Nv / THREADS).
#include "common/arch_params.cuh"

template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    gdn_gating_kernel(const bf16_t* __restrict__ a, int a_stride, const bf16_t* __restrict__ bb, int b_stride,
                      const float* __restrict__ a_log, const float* __restrict__ dt_bias, float* __restrict__ g,
                      float* __restrict__ beta, int T, int nv) {
  const int idx = blockIdx.x * THREADS + threadIdx.x;
  if (idx >= T * nv) return;
  const int t = idx / nv, h = idx % nv;
  const float x = bf16_to_f(a[(size_t)t * a_stride + h]) + dt_bias[h];
  // torch softplus (beta 1, threshold 20): x above the threshold passes through
  const float sp = x > 20.f ? x : log1pf(expf(x));
  g[idx] = -expf(a_log[h]) * sp;
  const float bv = bf16_to_f(bb[(size_t)t * b_stride + h]);
  beta[idx] = bf16_round(1.f / (1.f + expf(-bv)));
}

#ifdef DELTASERVE_NVCC_CHECK
template __global__ void gdn_gating_kernel<256>(const bf16_t*, int, const bf16_t*, int, const float*, const float*, float*, float*, int, int);
#endif
