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
  // each bf16 rounding takes two values per conversion (the same bits as one at a time)
  const unsigned int y01 = pack_bf16x2(xf[0] * rs, xf[1] * rs), y23 = pack_bf16x2(xf[2] * rs, xf[3] * rs);
  float wy[4] = {lo_bf16(y01), hi_bf16(y01), lo_bf16(y23), hi_bf16(y23)};
  if (w_bf16) {
    const bf16_t* w = static_cast<const bf16_t*>(weight) + c0;
    const unsigned int p01 = pack_bf16x2(bf16_to_f(w[0]) * wy[0], bf16_to_f(w[1]) * wy[1]);
    const unsigned int p23 = pack_bf16x2(bf16_to_f(w[2]) * wy[2], bf16_to_f(w[3]) * wy[3]);
    wy[0] = lo_bf16(p01);
    wy[1] = hi_bf16(p01);
    wy[2] = lo_bf16(p23);
    wy[3] = hi_bf16(p23);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) wy[e] *= static_cast<const float*>(weight)[c0 + e];
  }
  float o[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = wy[e] * silu_f(zf[e]);
  return make_uint2(pack_bf16x2(o[0], o[1]), pack_bf16x2(o[2], o[3]));
}
