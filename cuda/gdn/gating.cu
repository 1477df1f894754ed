// GDN gates: g = -exp(A_log) * softplus(a + dt_bias) in fp32, beta = sigmoid(b) rounded to bf16 (HF
// computes it in the model dtype) and widened. a, b [T, Nv] bf16 with row strides (they are usually
// column slices of a projection output); A_log, dt_bias [Nv] contiguous, each bf16 or fp32 (A_BF16,
// D_BF16: read as they are stored: widening them first cost two small launches per layer and step);
// g, beta [T, Nv] fp32 contiguous. One thread per (token, head); grid: ceil(T * Nv / THREADS).
#include "common/arch_params.cuh"

template <bool P_BF16>
__device__ __forceinline__ float gating_param(const void* p, int h) {
  return P_BF16 ? bf16_to_f(static_cast<const bf16_t*>(p)[h]) : static_cast<const float*>(p)[h];
}

template <int THREADS, bool A_BF16, bool D_BF16>
__global__ void __launch_bounds__(THREADS)
    gdn_gating_kernel(const bf16_t* __restrict__ a, int a_stride, const bf16_t* __restrict__ bb, int b_stride,
                      const void* __restrict__ a_log, const void* __restrict__ dt_bias, float* __restrict__ g,
                      float* __restrict__ beta, int T, int nv) {
  const int idx = blockIdx.x * THREADS + threadIdx.x;
  if (idx >= T * nv) return;
  const int t = idx / nv, h = idx % nv;
  const float x = bf16_to_f(a[(size_t)t * a_stride + h]) + gating_param<D_BF16>(dt_bias, h);
  // torch softplus (beta 1, threshold 20): x above the threshold passes through
  const float sp = x > 20.f ? x : log1pf(expf(x));
  g[idx] = -expf(gating_param<A_BF16>(a_log, h)) * sp;
  const float bv = bf16_to_f(bb[(size_t)t * b_stride + h]);
  beta[idx] = bf16_round(1.f / (1.f + expf(-bv)));
}

#ifdef DELTASERVE_NVCC_CHECK
template __global__ void gdn_gating_kernel<256, true, true>(const bf16_t*, int, const bf16_t*, int, const void*, const void*, float*, float*, int, int);
template __global__ void gdn_gating_kernel<256, false, true>(const bf16_t*, int, const bf16_t*, int, const void*, const void*, float*, float*, int, int);
template __global__ void gdn_gating_kernel<256, false, false>(const bf16_t*, int, const bf16_t*, int, const void*, const void*, float*, float*, int, int);
#endif
