// Gated delta rule, token-recurrent form, for both decode (one token per sequence) and varlen
// prefill (chunk_gated_delta_rule; the recurrence is the chunked math without the WY factorisation,
// equal up to fp32 rounding). All math in fp32, the state never leaves registers between tokens.
//
// Per token t of sequence b, value head h (key head h / (Nv / Nk)):
//   k = l2norm(k_t), q = l2norm(q_t) * scale       (eps 1e-6 added to the sum of squares)
//   S = exp(g_t) S;  kv = S^T k;  d = beta_t (v_t - kv);  S += k d^T;  o_t = S^T q
// Columns of S are independent given k and q, so the dv axis splits freely across warps and CTAs;
// only the dk reductions (k.k, q.q, S^T k, S^T q) cross lanes, and they stay inside one warp
// (shuffles), so warps never synchronise with each other.
//
// Thread layout in a warp: lane = r * CG + c with r in [0, RG) the row group (dk / RG consecutive
// rows) and c in [0, CG) the column group (4 consecutive dv columns, one float4 of each state row).
// grid: (Nv * DV / (WARPS * CG * 4), B), block: WARPS * 32.
//
// Layouts: q, k [T, Nk, DK] bf16 (token stride given, head stride DK), v [T, Nv, DV] bf16 (token
// stride given), g, beta [T, Nv] fp32 contiguous, state [S, Nv, DK, DV] ST contiguous (fp32 or bf16:
// state.cuh; the math is fp32 either way, a bf16 state is rounded once, when stored), out [T, Nv, DV]
// bf16 contiguous, qsl [B+1] int32 (nullptr: decode, token b is sequence b), slots [B] int32,
// has_init [B] u8 (nullptr: decode, always continue from the slot). slot <= 0 is padding: the state
// is neither read nor written (zero initial state), the output is still written.
#include "common/arch_params.cuh"
#include "state.cuh"

template <int DK, int DV, int RG, int WARPS, typename ST>
__global__ void __launch_bounds__(WARPS * 32)
    gdn_delta_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                     const float* __restrict__ g, const float* __restrict__ beta, ST* __restrict__ state,
                     const int* __restrict__ qsl, const int* __restrict__ slots,
                     const unsigned char* __restrict__ has_init, bf16_t* __restrict__ out, int nk, int nv,
                     int q_stride, int k_stride, int v_stride, float q_scale) {
  constexpr int CG = 32 / RG;          // column groups per warp
  constexpr int RPT = DK / RG;         // state rows per thread
  constexpr int COLS_W = CG * 4;       // dv columns per warp
  constexpr int COLS_CTA = COLS_W * WARPS;
  constexpr int NBLK = DV / COLS_CTA;  // CTAs per value head
  static_assert(32 % RG == 0 && DK % RG == 0 && RPT % 8 == 0, "row split must give 16-byte q/k loads");
  static_assert(DV % COLS_CTA == 0, "dv must split evenly over the CTA's columns");

  const int h = blockIdx.x / NBLK;
  const int cb = blockIdx.x % NBLK;
  const int b = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int w = threadIdx.x >> 5;
  const int r = lane / CG;
  const int c = lane % CG;
  const int jw = cb * COLS_CTA + w * COLS_W;  // first column of this warp
  const int j0 = jw + c * 4;                  // first of this thread's 4 columns
  const int i0 = r * RPT;                     // first of this thread's rows
  const int hk = h / (nv / nk);

  int t_begin = b, t_end = b + 1;
  if (qsl != nullptr) {
    t_begin = qsl[b];
    t_end = qsl[b + 1];
  }
  const int slot = slots[b];
  const bool live = slot > 0;
  const bool load = live && (has_init == nullptr || has_init[b] != 0);
  ST* sp = state + ((size_t)(live ? slot : 0) * nv + h) * DK * DV;

  // the state goes straight between DRAM and registers (4 values per row); staging it through shared
  // memory with warp-coalesced copies (the former default) was 1.3x slower at batch 32 and was removed
  float S[RPT][4];
  if (load) {
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii) StateIO<ST>::load4(sp + (size_t)(i0 + ii) * DV + j0, S[ii]);
  } else {
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii) S[ii][0] = S[ii][1] = S[ii][2] = S[ii][3] = 0.f;
  }

  // raw inputs of the next token, loaded one token ahead so the loads overlap the math
  uint4 kr[RPT / 8], qr[RPT / 8], kn_[RPT / 8], qn_[RPT / 8];
  uint2 vr = make_uint2(0, 0), vn_ = make_uint2(0, 0);
  float gr = 0.f, br = 0.f, gn_ = 0.f, bn_ = 0.f;
  auto fetch = [&](int t, uint4* kk, uint4* qq, uint2& vv, float& gg, float& bb) {
    const bf16_t* kp = k + (size_t)t * k_stride + hk * DK + i0;
    const bf16_t* qp = q + (size_t)t * q_stride + hk * DK + i0;
#pragma unroll
    for (int u = 0; u < RPT / 8; ++u) {
      kk[u] = *reinterpret_cast<const uint4*>(kp + 8 * u);
      qq[u] = *reinterpret_cast<const uint4*>(qp + 8 * u);
    }
    vv = *reinterpret_cast<const uint2*>(v + (size_t)t * v_stride + h * DV + j0);
    gg = g[(size_t)t * nv + h];
    bb = beta[(size_t)t * nv + h];
  };
  if (t_begin < t_end) fetch(t_begin, kn_, qn_, vn_, gn_, bn_);

  for (int t = t_begin; t < t_end; ++t) {
#pragma unroll
    for (int u = 0; u < RPT / 8; ++u) { kr[u] = kn_[u]; qr[u] = qn_[u]; }
    vr = vn_; gr = gn_; br = bn_;
    if (t + 1 < t_end) fetch(t + 1, kn_, qn_, vn_, gn_, bn_);

    float kf[RPT], qf[RPT];
#pragma unroll
    for (int u = 0; u < RPT / 8; ++u) { unpack8(kr[u], kf + 8 * u); unpack8(qr[u], qf + 8 * u); }
    float ssk = 0.f, ssq = 0.f;
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii) { ssk = fmaf(kf[ii], kf[ii], ssk); ssq = fmaf(qf[ii], qf[ii], ssq); }
#pragma unroll
    for (int m = CG; m < 32; m <<= 1) {
      ssk += __shfl_xor_sync(0xffffffffu, ssk, m);
      ssq += __shfl_xor_sync(0xffffffffu, ssq, m);
    }
    const float kscale = rsqrtf(ssk + 1e-6f);
    const float qscale = rsqrtf(ssq + 1e-6f);
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii) { kf[ii] *= kscale; qf[ii] = qf[ii] * qscale * q_scale; }

    const float eg = expf(gr);
    float kv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S[ii][e] *= eg;
        kv[e] = fmaf(S[ii][e], kf[ii], kv[e]);
      }
#pragma unroll
    for (int m = CG; m < 32; m <<= 1)
#pragma unroll
      for (int e = 0; e < 4; ++e) kv[e] += __shfl_xor_sync(0xffffffffu, kv[e], m);
    const float vf[4] = {lo_bf16(vr.x), hi_bf16(vr.x), lo_bf16(vr.y), hi_bf16(vr.y)};
    float d[4], o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int e = 0; e < 4; ++e) d[e] = (vf[e] - kv[e]) * br;
#pragma unroll
    for (int ii = 0; ii < RPT; ++ii)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S[ii][e] = fmaf(kf[ii], d[e], S[ii][e]);
        o[e] = fmaf(S[ii][e], qf[ii], o[e]);
      }
#pragma unroll
    for (int m = CG; m < 32; m <<= 1)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] += __shfl_xor_sync(0xffffffffu, o[e], m);

    if (r == 0) {  // lanes of row group 0 hold the reduced o of their 4 columns
      bf16_t* op = out + ((size_t)t * nv + h) * DV + j0;
      *reinterpret_cast<uint2*>(op) = make_uint2(pack_bf16x2(o[0], o[1]), pack_bf16x2(o[2], o[3]));
    }
  }

  if (!live) return;
#pragma unroll
  for (int ii = 0; ii < RPT; ++ii) StateIO<ST>::store4(sp + (size_t)(i0 + ii) * DV + j0, S[ii]);
}

#ifdef DELTASERVE_NVCC_CHECK
#define P_ ArchParams<DS_SM>
#define DS_DELTA_ARGS(ST) const bf16_t*, const bf16_t*, const bf16_t*, const float*, const float*, ST*, const int*, const int*, const unsigned char*, bf16_t*, int, int, int, int, int, float
template __global__ void gdn_delta_kernel<128, 128, P_::delta_rg, P_::delta_warps, float>(DS_DELTA_ARGS(float));
template __global__ void gdn_delta_kernel<128, 128, P_::delta_rg, P_::delta_warps, bf16_t>(DS_DELTA_ARGS(bf16_t));
#undef DS_DELTA_ARGS
#undef P_
#endif
