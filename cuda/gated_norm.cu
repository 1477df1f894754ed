// K5 gated RMSNorm, HF Qwen3_5RMSNormGated order: y = x * rsqrt(mean(x^2) + eps) in fp32, rounded to
// bf16; y = weight * y (a bf16 multiply when the weight is bf16, fp32 when it is fp32); y *= silu(z)
// in fp32; round to bf16. x [N, DV] bf16 (row stride), z [N, DV] bf16 (row stride), weight [DV],
// out [N, DV] bf16 contiguous. One warp per row: each lane owns DV / 32 consecutive elements.
// grid: ceil(N / WARPS), block: WARPS * 32.
#include "arch_params.cuh"

template <int DV, int WARPS, bool W_BF16>
__global__ void __launch_bounds__(WARPS * 32)
    gated_rms_norm_kernel(const bf16_t* __restrict__ x, int x_stride, const bf16_t* __restrict__ z, int z_stride,
                          const void* __restrict__ weight, bf16_t* __restrict__ out, int N, float eps) {
  constexpr int PER = DV / 32;
  static_assert(PER == 4, "one 8-byte vector per lane");
  const int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const int c0 = lane * PER;
  const uint2 xr = *reinterpret_cast<const uint2*>(x + (size_t)row * x_stride + c0);
  const uint2 zr = *reinterpret_cast<const uint2*>(z + (size_t)row * z_stride + c0);
  const float xf[4] = {lo_bf16(xr.x), hi_bf16(xr.x), lo_bf16(xr.y), hi_bf16(xr.y)};
  const float zf[4] = {lo_bf16(zr.x), hi_bf16(zr.x), lo_bf16(zr.y), hi_bf16(zr.y)};
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) ss = fmaf(xf[e], xf[e], ss);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
  const float rs = rsqrtf(ss / (float)DV + eps);
  float o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float y = bf16_round(xf[e] * rs);
    float wy;
    if constexpr (W_BF16) wy = bf16_round(bf16_to_f(reinterpret_cast<const bf16_t*>(weight)[c0 + e]) * y);
    else wy = reinterpret_cast<const float*>(weight)[c0 + e] * y;
    o[e] = wy * silu_f(zf[e]);
  }
  *reinterpret_cast<uint2*>(out + (size_t)row * DV + c0) = make_uint2(pack_bf16x2(o[0], o[1]), pack_bf16x2(o[2], o[3]));
}

#ifdef DELTASERVE_NVCC_CHECK
template __global__ void gated_rms_norm_kernel<128, ArchParams<DS_SM>::norm_warps, true>(const bf16_t*, int, const bf16_t*, int, const void*, bf16_t*, int, float);
template __global__ void gated_rms_norm_kernel<128, ArchParams<DS_SM>::norm_warps, false>(const bf16_t*, int, const bf16_t*, int, const void*, bf16_t*, int, float);
#endif
