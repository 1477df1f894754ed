// The gated RMSNorm of one 128-wide row held by a warp, each lane owning 4 consecutive elements
// (c0 = 4 * lane) (gated_norm_row4), or by a half warp, each lane owning 8 (gated_norm_row8, the same
// bits: below), in HF Qwen3_5RMSNormGated order: y = x * rsqrt(mean(x^2) + eps) in fp32, rounded
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

// The same row held by a half warp, lane j (0..15) owning elements c0 = 8 j .. 8 j + 7, with the same
// bits as gated_norm_row4: each element's math is row4's, and the sum of squares is reduced in row4's
// order. Row4's lane l = 2 j + e holds this lane's elements 4 e .. 4 e + 3, so a (e = 0) and b (e = 1)
// are row4's per-lane partial sums; its butterfly levels 16, 8, 4, 2 pair lanes 2 j + e and
// 2 (j ^ 8/4/2/1) + e, which are levels 8, 4, 2, 1 here on a and on b apiece, and its last level
// (lanes 2 j and 2 j + 1) is a + b. Every lane of both forms ends with the same fp32 sum. The shuffles
// stay inside the half warp (xor < 16), so two rows share a warp; both halves must reach them.
__device__ __forceinline__ uint4 gated_norm_row8(const float* xf, const uint4& zr, const void* weight, bool w_bf16,
                                                 float eps, int c0) {
  float zf[8];
  unpack8(zr, zf);
  float a = 0.f, b = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) a = fmaf(xf[e], xf[e], a);
#pragma unroll
  for (int e = 4; e < 8; ++e) b = fmaf(xf[e], xf[e], b);
#pragma unroll
  for (int m = 8; m > 0; m >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, m);
    b += __shfl_xor_sync(0xffffffffu, b, m);
  }
  const float ss = a + b;
  const float rs = rsqrtf(ss / 128.f + eps);
  unsigned int y[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) y[p] = pack_bf16x2(xf[2 * p] * rs, xf[2 * p + 1] * rs);
  float wy[8];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    wy[2 * p] = lo_bf16(y[p]);
    wy[2 * p + 1] = hi_bf16(y[p]);
  }
  if (w_bf16) {
    float wf[8];
    unpack8(*reinterpret_cast<const uint4*>(static_cast<const bf16_t*>(weight) + c0), wf);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const unsigned int q = pack_bf16x2(wf[2 * p] * wy[2 * p], wf[2 * p + 1] * wy[2 * p + 1]);
      wy[2 * p] = lo_bf16(q);
      wy[2 * p + 1] = hi_bf16(q);
    }
  } else {
    const float4* w4 = reinterpret_cast<const float4*>(static_cast<const float*>(weight) + c0);
    const float4 w0 = w4[0], w1 = w4[1];
    const float wf[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) wy[e] *= wf[e];
  }
  float o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = wy[e] * silu_f(zf[e]);
  return pack8(o);
}
