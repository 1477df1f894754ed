// K5 gated RMSNorm (math in gated_norm.cuh). x and z hold N rows of DV bf16 each, laid out as
// [N / heads, heads, DV]: row r starts at (r / heads) * stride + (r % heads) * DV, each with its own
// stride and heads (heads = 1: plain rows with a row stride). So the GDN core passes its gate z as
// the [T, Nv, DV] view of the fused projection it is, with no copy. weight [DV], out [N, DV] bf16
// contiguous. One warp per row: each lane owns DV / 32 consecutive elements, loaded before the
// warp's reduction and stored after it, so out may be x itself (contiguous rows: the GDN core
// normalises the delta rule's output in place); x and out carry no __restrict__ for that.
// grid: ceil(N / WARPS), block: WARPS * 32.
#include "common/arch_params.cuh"
#include "norm/gated_norm.cuh"

template <int DV, int WARPS, bool W_BF16>
__global__ void __launch_bounds__(WARPS * 32)
    gated_rms_norm_kernel(const bf16_t* x, int x_stride, int x_heads, const bf16_t* __restrict__ z,
                          int z_stride, int z_heads, const void* __restrict__ weight, bf16_t* out, int N,
                          float eps) {
  constexpr int PER = DV / 32;
  static_assert(DV == 128 && PER == 4, "one 8-byte vector per lane of a 128-wide row");
  const int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const int c0 = lane * PER;
  const size_t xo = (size_t)(row / x_heads) * x_stride + (size_t)(row % x_heads) * DV;
  const size_t zo = (size_t)(row / z_heads) * z_stride + (size_t)(row % z_heads) * DV;
  const uint2 xr = *reinterpret_cast<const uint2*>(x + xo + c0);
  const uint2 zr = *reinterpret_cast<const uint2*>(z + zo + c0);
  const float xf[4] = {lo_bf16(xr.x), hi_bf16(xr.x), lo_bf16(xr.y), hi_bf16(xr.y)};
  *reinterpret_cast<uint2*>(out + (size_t)row * DV + c0) = gated_norm_row4(xf, zr, weight, W_BF16, eps, c0);
}

// The same norm with two rows per warp (a half warp per row, 8 values a lane: gated_norm_row8, the same
// bits). Each lane's x, z and weight loads are one 16-byte vector, and a warp's per-row work (the
// address arithmetic, rsqrt) is shared by twice the values: the one-row form is issue bound (65% of
// issue slots busy at 2.35 TB/s, Nsight Compute, docs/bench-evidence/2026-12-02-s30.md). Needs x, z,
// out and the weight 16-byte aligned with row strides a multiple of 8 (the wrapper checks).
// grid: ceil(N / (2 * WARPS)), block: WARPS * 32.
template <int DV, int WARPS, bool W_BF16>
__global__ void __launch_bounds__(WARPS * 32)
    gated_rms_norm2_kernel(const bf16_t* x, int x_stride, int x_heads, const bf16_t* __restrict__ z,
                           int z_stride, int z_heads, const void* __restrict__ weight, bf16_t* out, int N,
                           float eps) {
  static_assert(DV == 128, "a half warp of 8-value lanes covers a 128-wide row");
  const int first = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * 2;  // the warp's first row
  if (first >= N) return;  // the whole warp: the shuffles need both halves or neither
  const int lane = threadIdx.x & 31, c0 = (lane & 15) * 8;
  const int mine = first + (lane >> 4);
  const bool ok = mine < N;
  const int row = ok ? mine : N - 1;  // a half past the end recomputes the last row and stores nothing
  const size_t xo = (size_t)(row / x_heads) * x_stride + (size_t)(row % x_heads) * DV;
  const size_t zo = (size_t)(row / z_heads) * z_stride + (size_t)(row % z_heads) * DV;
  const uint4 xr = *reinterpret_cast<const uint4*>(x + xo + c0);
  const uint4 zr = *reinterpret_cast<const uint4*>(z + zo + c0);
  float xf[8];
  unpack8(xr, xf);
  const uint4 y = gated_norm_row8(xf, zr, weight, W_BF16, eps, c0);
  if (ok) *reinterpret_cast<uint4*>(out + (size_t)row * DV + c0) = y;
}

#ifdef DELTASERVE_NVCC_CHECK
template __global__ void gated_rms_norm_kernel<128, ArchParams<DS_SM>::norm_warps, true>(const bf16_t*, int, int, const bf16_t*, int, int, const void*, bf16_t*, int, float);
template __global__ void gated_rms_norm_kernel<128, ArchParams<DS_SM>::norm_warps, false>(const bf16_t*, int, int, const bf16_t*, int, int, const void*, bf16_t*, int, float);
template __global__ void gated_rms_norm2_kernel<128, ArchParams<DS_SM>::norm_warps, true>(const bf16_t*, int, int, const bf16_t*, int, int, const void*, bf16_t*, int, float);
template __global__ void gated_rms_norm2_kernel<128, ArchParams<DS_SM>::norm_warps, false>(const bf16_t*, int, int, const bf16_t*, int, int, const void*, bf16_t*, int, float);
#endif
