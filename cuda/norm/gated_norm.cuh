// The gated RMSNorm of one 128-wide row held by a warp, each lane owning 4 consecutive elements
// (c0 = 4 * lane), in HF Qwen3_5RMSNormGated order: y = x * rsqrt(mean(x^2) + eps) in fp32, rounded
// to bf16; y = weight * y (a bf16 multiply when the weight is bf16, fp32 when it is fp32); y *= silu(z)
// in fp32; rounded to bf16. Shared by gated_norm.cu (K5) and gdn_decode.cu (K4's epilogue), so both
// round and reduce in the same order.
#pragma once
#include "common/arch_params.cuh"

__device__ __forceinline__ uint2 gated_norm_row4(const float* xf, const uint2& zr, const void* weight, bool w_bf16,
                                                 float eps, int c0) {
  const float zf[4] = {lo_bf16(zr.x), hi_bf16(zr.x), lo_bf16(zr.y), hi_bf16(zr.y)};
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) ss = fmaf(xf[e], xf[e], ss);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
  const float rs = rsqrtf(ss / 128.f + eps);
  float o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float y = bf16_round(xf[e] * rs);
    float wy;
    if (w_bf16) wy = bf16_round(bf16_to_f(static_cast<const bf16_t*>(weight)[c0 + e]) * y);
    else wy = static_cast<const float*>(weight)[c0 + e] * y;
    o[e] = wy * silu_f(zf[e]);
  }
  return make_uint2(pack_bf16x2(o[0], o[1]), pack_bf16x2(o[2], o[3]));
}
