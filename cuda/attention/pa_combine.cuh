// The split-KV combine pass of paged_attention.cu (included there after the main kernel).
// Merge the num_splits partial results of every (token, head) row: weights 2^(lse_s - max lse) (a
// split that saw nothing has lse = -inf and wrote O = 0, so it weighs exactly 0); then the main
// kernel's epilogue. One CTA of D / 4 threads per row, 4 columns per thread; the split loop is
// unrolled so several partial loads are in flight (it was latency bound at 35 splits).
template <int D>
__global__ void __launch_bounds__(D / 4)
    paged_attn_combine_kernel(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                              const pa::bf16_t* __restrict__ gate, pa::bf16_t* __restrict__ out, int num_rows,
                              int num_heads, int num_splits, int g_stride_t, int g_stride_h) {
  DS_PDL_BEGIN();  // cuda/common/pdl.cuh: before any read of the previous kernels' outputs
  using namespace pa;
  __shared__ float lse_s[PA_MAX_SPLITS];
  const int row = blockIdx.x, col = threadIdx.x * 4;
  for (int s = threadIdx.x; s < num_splits; s += D / 4) lse_s[s] = lse_part[(size_t)s * num_rows + row];
  __syncthreads();
  float mx = neg_inf();
  for (int s = 0; s < num_splits; ++s) mx = fmaxf(mx, lse_s[s]);
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, wsum = 0.f;
  const float* src = o_part + (size_t)row * D + col;
#pragma unroll 8
  for (int s = 0; s < num_splits; ++s) {
    const float wt = exp2f(lse_s[s] - mx);
    const float4 v = *reinterpret_cast<const float4*>(src + (size_t)s * num_rows * D);
    wsum += wt;
    acc[0] = fmaf(wt, v.x, acc[0]);
    acc[1] = fmaf(wt, v.y, acc[1]);
    acc[2] = fmaf(wt, v.z, acc[2]);
    acc[3] = fmaf(wt, v.w, acc[3]);
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  uint2 r;
  if (gate != nullptr) {
    const int tok = row / num_heads, h = row - tok * num_heads;
    const uint2 g = *reinterpret_cast<const uint2*>(gate + (size_t)tok * g_stride_t + (size_t)h * g_stride_h + col);
    r.x = pack_bf16x2(gated(acc[0] * inv, lo_f(g.x)), gated(acc[1] * inv, hi_f(g.x)));
    r.y = pack_bf16x2(gated(acc[2] * inv, lo_f(g.y)), gated(acc[3] * inv, hi_f(g.y)));
  } else {
    r.x = pack_bf16x2(acc[0] * inv, acc[1] * inv);
    r.y = pack_bf16x2(acc[2] * inv, acc[3] * inv);
  }
  *reinterpret_cast<uint2*>(out + (size_t)row * D + col) = r;
}
