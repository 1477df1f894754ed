// The split-KV combine pass of paged_attention.cu (included there after the main kernel).
//
// Merges the num_splits partial results of every (token, head) row: weights 2^(lse_s - max lse) (a
// split that saw nothing has lse = -inf and wrote O = 0, so it weighs exactly 0), then the main
// kernel's epilogue. One CTA of D threads per row: P = 4 groups of D / 4 threads, 4 columns per
// thread; group p takes splits p, p + P, ... (at most PER of them, a template argument the wrapper
// picks from the split count). Every load a thread needs - its splits' lse and partials, the gate -
// is issued at once after the PDL wait, so the pass costs one round trip to L2, not one per
// dependent load (lse, then partials in batches, then the gate: 5.9 us at 35 splits, 3.7 us at 4 in
// session 26). Each group sums against its own max; group 0 merges the four sums through shared
// memory in a fixed order. Deterministic: no atomics.
template <int D, int PER>
__global__ void __launch_bounds__(D)
    paged_attn_combine_kernel(const float* __restrict__ o_part, const float* __restrict__ lse_part,
                              const pa::bf16_t* __restrict__ gate, pa::bf16_t* __restrict__ out, int num_rows,
                              int num_heads, int num_splits, int g_stride_t, int g_stride_h) {
  DS_PDL_BEGIN();  // cuda/common/pdl.cuh: before any read of the previous kernels' outputs
  using namespace pa;
  constexpr int CT = D / 4, P = 4;
  static_assert(PER >= 1 && PER * P <= PA_MAX_SPLITS, "splits per group");
  __shared__ float4 acc_s[P][CT];
  __shared__ float m_s[P], w_s[P];
  const int row = blockIdx.x, p = threadIdx.x / CT, c = threadIdx.x % CT;
  const int tok = row / num_heads, h = row - tok * num_heads;
  uint2 g = make_uint2(0u, 0u);
  if (gate != nullptr && p == 0)
    g = *reinterpret_cast<const uint2*>(gate + (size_t)tok * g_stride_t + (size_t)h * g_stride_h + c * 4);
  const float* src = o_part + (size_t)row * D + c * 4;
  float lse[PER];
  float4 v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int s = p + i * P;
    const bool ok = s < num_splits;
    lse[i] = ok ? lse_part[(size_t)s * num_rows + row] : neg_inf();
    v[i] = ok ? *reinterpret_cast<const float4*>(src + (size_t)s * num_rows * D) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float mx = neg_inf();
#pragma unroll
  for (int i = 0; i < PER; ++i) mx = fmaxf(mx, lse[i]);
  const float mu = mx == neg_inf() ? 0.f : mx;  // a group none of whose splits saw a key sums to 0
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const float wt = exp2f(lse[i] - mu);
    wsum += wt;
    acc.x = fmaf(wt, v[i].x, acc.x);
    acc.y = fmaf(wt, v[i].y, acc.y);
    acc.z = fmaf(wt, v[i].z, acc.z);
    acc.w = fmaf(wt, v[i].w, acc.w);
  }
  acc_s[p][c] = acc;
  if (c == 0) {
    m_s[p] = mx;
    w_s[p] = wsum;
  }
  __syncthreads();
  if (p != 0) return;
  float big = neg_inf();
#pragma unroll
  for (int q = 0; q < P; ++q) big = fmaxf(big, m_s[q]);
  const float bu = big == neg_inf() ? 0.f : big;
  float o4[4] = {0.f, 0.f, 0.f, 0.f}, wt_all = 0.f;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const float sc = exp2f(m_s[q] - bu);  // 0 for a group with m = -inf
    const float4 a = acc_s[q][c];
    wt_all = fmaf(sc, w_s[q], wt_all);
    o4[0] = fmaf(sc, a.x, o4[0]);
    o4[1] = fmaf(sc, a.y, o4[1]);
    o4[2] = fmaf(sc, a.z, o4[2]);
    o4[3] = fmaf(sc, a.w, o4[3]);
  }
  const float inv = wt_all > 0.f ? 1.f / wt_all : 0.f;
  uint2 r;
  if (gate != nullptr) {
    r.x = gated2(o4[0] * inv, o4[1] * inv, g.x);
    r.y = gated2(o4[2] * inv, o4[3] * inv, g.y);
  } else {
    r.x = pack_bf16x2(o4[0] * inv, o4[1] * inv);
    r.y = pack_bf16x2(o4[2] * inv, o4[3] * inv);
  }
  *reinterpret_cast<uint2*>(out + (size_t)row * D + c * 4) = r;
}
