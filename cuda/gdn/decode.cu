// K4 fused GDN decode: one token per sequence, one launch per layer. Per (sequence b, value head h):
//   x = silu(conv4(conv_state[slot] ++ qkv[b]))  (q|k of key head hk = h / (Nv/Nk), v of h; state shifted)
//   g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
//   k = l2norm(k), q = l2norm(q) * dk^-0.5;  S = e^g S;  S += k (beta (v - S^T k))^T;  o = S^T q
//   y = bf16(bf16(rmsnorm(bf16(o))) * w) * silu(z)  (HF Qwen3_5RMSNormGated order)
// Rounding points and fp32 reduction orders are those of gdn_conv.cu (decode), gdn_gating.cu,
// gdn_delta.cu (RG = 8) and gated_norm.cu, so the result is bitwise equal to running those four.
//
// One CTA of 8 warps per value head (b, h); a warp owns 16 state columns x 128 rows, lane r * 4 + c
// holds rows 16r..16r+15 of 4 columns (gdn_delta.cu); the state is loaded first, so the conv and
// gate work overlaps its DRAM latency, and the gated norm runs in the epilogue from shared memory.
// q|k conv channels of key head hk are recomputed from the old conv state by the Nv/Nk CTAs that
// use them, and the last to arrive (int counter per (b, hk) after a barrier and a fence) writes the
// shifted state and resets the counter to 0: no CTA ever waits on another. v channels are private.
// Layouts: qkv [B, C] bf16 (row stride, C = (2 Nk + Nv) * 128), z [B, Nv*128] bf16 (row stride),
// b, a [B, Nv] bf16 (row strides), conv_w [C, 4] bf16, conv_state [S, C, 3] bf16, A_log, dt_bias [Nv]
// and norm_w [128] bf16 or fp32 (flags bits 0, 1, 2 set: bf16), state [S, Nv, 128, 128] ST (fp32 or
// bf16: state.cuh; fp32 math either way, a bf16 state rounded once when stored after the step), slots
// [B] int32 (slot <= 0: padding, zero state, nothing read or written), y [B, Nv*128] bf16 contiguous,
// cnt_qk [B*Nk] int32, zero between launches.
#include "common/arch_params.cuh"
#include "common/pdl.cuh"
#include "norm/gated_norm.cuh"
#include "state.cuh"

// Tuning rows (engine/ops/gdn/decode.py parses them): SM, warps per CTA (the kernel needs 8: a CTA
// owns a whole head), CTAs per SM the register cap is sized for (2: 128 registers; nvcc 13.0 spills
// nothing, NVRTC 12.8-13.0 spill 4 bytes for sm_90 only; the spill-free form with z held in shared
// memory was 1-2% slower at B = 1..64, session 35: docs/bench-evidence/2026-12-04-s35.md).
// Recorded and removed after H200 runs (2026-12, us per layer at B = 1 / 8 / 32 / 64, this kernel
// 5.4-5.9 / 14.0 / 44.8-45.6 / 82.4-82.7):
//  * a head's columns split over 2, 4, 8 CTAs of 4, 2, 1 warps, norm finished by the last arriving
//    CTA through y: 6.8-8.3 / 14.8-17.5 / 46.0-55.8 / 85.6-102.2 (more redundant q|k conv, counters);
//  * L2 prefetch of the state of the CTA one wave ahead: +1-8% at B >= 32 (it only competes);
//  * persistent CTAs (2 per SM) that cp.async the next head's state and inputs into 72 KB of shared
//    memory while computing the current head: 6.5 / 15.7 / 53.4 / 102.7 (the same 128 KB per SM in
//    flight as two plain CTAs, plus serialised per-head phases and no dynamic tail balancing).
#define DS_DECODE_TABLE(X) \
  X(80, 8, 2)              \
  X(90, 8, 2)              \
  X(120, 8, 2)

template <int SM>
struct DecodeParams;
#define DS_DECODE_ROW(SM, WARPS, CTAS_PER_SM)      \
  template <>                                      \
  struct DecodeParams<SM> {                        \
    static constexpr int warps = WARPS;            \
    static constexpr int ctas_per_sm = CTAS_PER_SM; \
  };
DS_DECODE_TABLE(DS_DECODE_ROW)
#undef DS_DECODE_ROW

#define DEC_D 128  // dk = dv

__device__ __forceinline__ unsigned int half_of(const unsigned int* w, int t) {
  return (w[t >> 1] >> ((t & 1) * 16)) & 0xffffu;
}

__device__ __forceinline__ float param_f(const void* p, int i, bool is_bf16) {
  return is_bf16 ? bf16_to_f(static_cast<const bf16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// explicit vector store (NVVM split some uint2 stores into scalar ones; the state's: state.cuh)
__device__ __forceinline__ void st_u2(bf16_t* p, uint2 v) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}

// Width-4 conv + SiLU of 4 channels (gdn_conv.cu decode): x (4 bf16), taps (16 bf16, channel-major),
// state (12 bf16, channel-major, zeros for padding) -> out: bf16(SiLU(bf16(conv))); ns: shifted state.
// 4 channels rather than 8 keep the prologue within 128 registers while the state loads are in flight.
__device__ __forceinline__ void conv4(const uint2& xr, const uint4* wr, const uint2* sr, float* out, uint2* ns) {
  const unsigned int xw[2] = {xr.x, xr.y};
  const unsigned int ww[8] = {wr[0].x, wr[0].y, wr[0].z, wr[0].w, wr[1].x, wr[1].y, wr[1].z, wr[1].w};
  const unsigned int sw[6] = {sr[0].x, sr[0].y, sr[1].x, sr[1].y, sr[2].x, sr[2].y};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float acc = 0.f;
#pragma unroll
    for (int t = 0; t < 3; ++t)
      acc = fmaf(bf16_to_f((bf16_t)half_of(ww, 4 * e + t)), bf16_to_f((bf16_t)half_of(sw, 3 * e + t)), acc);
    out[e] = fmaf(bf16_to_f((bf16_t)half_of(ww, 4 * e + 3)), bf16_to_f((bf16_t)half_of(xw, e)), acc);
  }
  // bf16(silu(bf16(conv))), two channels per conversion: the same bits as one at a time
#pragma unroll
  for (int e = 0; e < 4; e += 2) {
    const unsigned int r = pack_bf16x2(out[e], out[e + 1]);
    const unsigned int s = pack_bf16x2(silu_f(lo_bf16(r)), silu_f(hi_bf16(r)));
    out[e] = lo_bf16(s);
    out[e + 1] = hi_bf16(s);
  }
  unsigned int nw[6];
#pragma unroll
  for (int p = 0; p < 6; ++p) {
    unsigned int h2[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int t = 2 * p + s, e = t / 3, i = t % 3;
      h2[s] = i < 2 ? half_of(sw, 3 * e + i + 1) : half_of(xw, e);
    }
    nw[p] = h2[0] | (h2[1] << 16);
  }
#pragma unroll
  for (int u = 0; u < 3; ++u) ns[u] = make_uint2(nw[2 * u], nw[2 * u + 1]);
}

// gdn_gating.cu: g (fp32) and beta (bf16-rounded) of (row, head) from raw a, b and the parameters
__device__ __forceinline__ void gate(float a, float bv, float a_log, float dt_bias, float* gb) {
  const float x = a + dt_bias;
  const float spl = x > 20.f ? x : log1pf(expf(x));
  gb[0] = -expf(a_log) * spl;
  gb[1] = bf16_round(1.f / (1.f + expf(-bv)));
}

// gdn_delta.cu for one token on this thread's 16 rows x 4 columns: q at qk_s[0..127], k at
// qk_s[128..255] (conv outputs), vf its 4 values of v. Returns o (all lanes) for the 4 columns.
__device__ __forceinline__ void delta_step(float (&S)[16][4], const float* qk_s, int i0, const float* vf,
                                           const float* gb, float q_scale, float* o) {
  float kf[16], ssk = 0.f, ssq = 0.f;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float4 kk = *reinterpret_cast<const float4*>(qk_s + DEC_D + i0 + 4 * u);
    const float4 qq = *reinterpret_cast<const float4*>(qk_s + i0 + 4 * u);
    kf[4 * u] = kk.x; kf[4 * u + 1] = kk.y; kf[4 * u + 2] = kk.z; kf[4 * u + 3] = kk.w;
    const float qv[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      ssk = fmaf(kf[4 * u + e], kf[4 * u + e], ssk);
      ssq = fmaf(qv[e], qv[e], ssq);
    }
  }
#pragma unroll
  for (int m = 4; m < 32; m <<= 1) {
    ssk += __shfl_xor_sync(0xffffffffu, ssk, m);
    ssq += __shfl_xor_sync(0xffffffffu, ssq, m);
  }
  const float kscale = rsqrtf(ssk + 1e-6f);
  const float qscale = rsqrtf(ssq + 1e-6f);
#pragma unroll
  for (int ii = 0; ii < 16; ++ii) kf[ii] *= kscale;
  const float eg = expf(gb[0]);
  float kv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int ii = 0; ii < 16; ++ii)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      S[ii][e] *= eg;
      kv[e] = fmaf(S[ii][e], kf[ii], kv[e]);
    }
#pragma unroll
  for (int m = 4; m < 32; m <<= 1)
#pragma unroll
    for (int e = 0; e < 4; ++e) kv[e] += __shfl_xor_sync(0xffffffffu, kv[e], m);
  float d[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) d[e] = (vf[e] - kv[e]) * gb[1];
  // k and q are read from shared memory again, 4 rows at a time, and rescaled (same values), so
  // neither kf nor a full qf is live across the update: 128 registers without spills
  asm volatile("" ::: "memory");
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = 0.f;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float4 kk = *reinterpret_cast<const float4*>(qk_s + DEC_D + i0 + 4 * u);
    const float4 qq = *reinterpret_cast<const float4*>(qk_s + i0 + 4 * u);
    const float k4[4] = {kk.x * kscale, kk.y * kscale, kk.z * kscale, kk.w * kscale};
    const float q4[4] = {qq.x * qscale * q_scale, qq.y * qscale * q_scale, qq.z * qscale * q_scale,
                         qq.w * qscale * q_scale};
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S[4 * u + t][e] = fmaf(k4[t], d[e], S[4 * u + t][e]);
        o[e] = fmaf(S[4 * u + t][e], q4[t], o[e]);
      }
  }
#pragma unroll
  for (int m = 4; m < 32; m <<= 1)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] += __shfl_xor_sync(0xffffffffu, o[e], m);
}

// q|k last-arriver: after the CTA's reads of the old q|k conv state (a barrier before this call),
// one thread counts this CTA in; returns whether it is the last of `sharers` (and resets the counter)
__device__ __forceinline__ int qk_last(int* cnt, bool live, int sharers) {
  if (!live) return 0;
  if (sharers == 1) return 1;
  __threadfence();
  const int last = atomicAdd(cnt, 1) == sharers - 1;
  if (last) {
    atomicExch(cnt, 0);
    __threadfence();
  }
  return last;
}

// a warp writes the shifted q|k conv state of key head hk (64 units of 4 channels from qst)
__device__ __forceinline__ void write_qk_state(bf16_t* conv_state, size_t sslot, int C, int nk, int hk,
                                               const uint2 (*qst)[3], int lane) {
#pragma unroll
  for (int u = lane; u < 64; u += 32) {
    const int cc = u < 32 ? hk * DEC_D + u * 4 : (nk + hk) * DEC_D + (u - 32) * 4;
    uint2* stp = reinterpret_cast<uint2*>(conv_state + (sslot * C + cc) * 3);
    stp[0] = qst[u][0]; stp[1] = qst[u][1]; stp[2] = qst[u][2];
  }
}

#define DS_DECODE_PARAMS                                                                                    \
  const bf16_t *__restrict__ qkv, int qkv_stride, const bf16_t *__restrict__ z, int z_stride,               \
      const bf16_t *__restrict__ bgate, int b_stride, const bf16_t *__restrict__ agate, int a_stride,       \
      const bf16_t *__restrict__ conv_w, bf16_t *__restrict__ conv_state, const void *__restrict__ a_log,   \
      const void *__restrict__ dt_bias, const void *__restrict__ norm_w, float eps, ST *__restrict__ state, \
      const int *__restrict__ slots, int *__restrict__ cnt_qk, bf16_t *__restrict__ y, int nk, int nv,      \
      int flags, float q_scale

// grid: B * Nv, block: 32 * W = 256, at most 128 registers: 2 CTAs per SM. CTAS (the launch bounds'
// CTAs per SM) is a template argument from the wrapper's row of DS_DECODE_TABLE, not
// DecodeParams<DS_SM>: a device without a row of its own (sm_89, sm_100, ...) compiles the row
// engine/ops/gdn/decode.py picked for it (the newest not newer) instead of failing to compile.
template <int W, typename ST, int CTAS>
__global__ void __launch_bounds__(W * 32, CTAS) gdn_decode_kernel(DS_DECODE_PARAMS) {
  static_assert(W == 8, "a CTA owns a whole value head");
  __shared__ __align__(16) float f_s[3 * DEC_D];  // conv outputs q | k | v
  __shared__ __align__(16) float o_s[DEC_D];
  __shared__ __align__(16) uint2 qst_s[64][3];     // shifted q|k conv state, for the last sharer
  __shared__ float gb_s[2];
  __shared__ int flag_s[1];

  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int r = lane >> 2, c = lane & 3;
  const int hv = blockIdx.x % nv, b = blockIdx.x / nv;
  const int rep = nv / nk, hk = hv / rep;
  const int C = (2 * nk + nv) * DEC_D;
  const int jc = w * 16 + c * 4;  // first of this thread's 4 columns
  const int i0 = r * 16;          // first of this thread's 16 rows
  const int slot = slots[b];
  const bool live = slot > 0;
  const size_t sslot = live ? (size_t)slot : 0;

  // the state loads go first: the conv and gate work below overlaps their DRAM latency
  ST* sp = state + (sslot * nv + hv) * (DEC_D * DEC_D) + jc;
  float S[16][4];
  if (live) {
#pragma unroll
    for (int ii = 0; ii < 16; ++ii) StateIO<ST>::load4(sp + (size_t)(i0 + ii) * DEC_D, S[ii]);
  } else {
#pragma unroll
    for (int ii = 0; ii < 16; ++ii) S[ii][0] = S[ii][1] = S[ii][2] = S[ii][3] = 0.f;
  }
  // PDL (cuda/common/pdl.cuh): the slots and this layer's state are written by no kernel of the
  // step before this one, so their loads above may overlap the in_proj GEMM; everything below waits.
  DS_PDL_BEGIN();
  if (tid < 96) {  // conv of 4 channels: q (units 0..31), k (32..63), v (64..95)
    const int cc = (tid < 32 ? hk : tid < 64 ? nk + hk : 2 * nk + hv) * DEC_D + (tid & 31) * 4;
    const uint2 xr = *reinterpret_cast<const uint2*>(qkv + (size_t)b * qkv_stride + cc);
    const uint4* wp = reinterpret_cast<const uint4*>(conv_w + (size_t)cc * 4);
    const uint4 wr[2] = {wp[0], wp[1]};
    uint2* stp = reinterpret_cast<uint2*>(conv_state + (sslot * C + cc) * 3);
    uint2 sr[3] = {make_uint2(0u, 0u), make_uint2(0u, 0u), make_uint2(0u, 0u)};
    if (live) {
      sr[0] = stp[0]; sr[1] = stp[1]; sr[2] = stp[2];
    }
    float out[4];
    uint2 ns[3];
    conv4(xr, wr, sr, out, ns);
    *reinterpret_cast<float4*>(f_s + tid * 4) = make_float4(out[0], out[1], out[2], out[3]);
    if (tid < 64) {
      qst_s[tid][0] = ns[0]; qst_s[tid][1] = ns[1]; qst_s[tid][2] = ns[2];
    } else if (live) {  // v channels belong to this CTA alone
      stp[0] = ns[0]; stp[1] = ns[1]; stp[2] = ns[2];
    }
  }
  if (tid == 255)
    gate(bf16_to_f(agate[(size_t)b * a_stride + hv]), bf16_to_f(bgate[(size_t)b * b_stride + hv]),
         param_f(a_log, hv, flags & 1), param_f(dt_bias, hv, flags & 2), gb_s);
  uint2 zr = make_uint2(0u, 0u);
  if (w == 0) zr = *reinterpret_cast<const uint2*>(z + (size_t)b * z_stride + hv * DEC_D + lane * 4);
  __syncthreads();  // (1) conv outputs and gates in shared memory; our reads of the old q|k state done
  if (tid == 0) flag_s[0] = qk_last(cnt_qk + (size_t)b * nk + hk, live, rep);

  const float4 vv = *reinterpret_cast<const float4*>(f_s + 2 * DEC_D + jc);
  const float vf[4] = {vv.x, vv.y, vv.z, vv.w};
  float o[4];
  delta_step(S, f_s, i0, vf, gb_s, q_scale, o);
  if (r == 0) {
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const unsigned int r = pack_bf16x2(o[e], o[e + 1]);
      o_s[jc + e] = lo_bf16(r);
      o_s[jc + e + 1] = hi_bf16(r);
    }
  }
  if (live) {
#pragma unroll
    for (int ii = 0; ii < 16; ++ii) StateIO<ST>::store4(sp + (size_t)(i0 + ii) * DEC_D, S[ii]);
  }
  __syncthreads();  // (2) o row and q|k flag visible
  if (w == 0) {
    const float4 x4 = *reinterpret_cast<const float4*>(o_s + lane * 4);
    const float xf[4] = {x4.x, x4.y, x4.z, x4.w};
    st_u2(y + (size_t)blockIdx.x * DEC_D + lane * 4, gated_norm_row4(xf, zr, norm_w, (flags & 4) != 0, eps, lane * 4));
  }
  if (w == 1 && flag_s[0]) write_qk_state(conv_state, sslot, C, nk, hk, qst_s, lane);
}

#ifdef DELTASERVE_NVCC_CHECK
// CI compile check (tests/test_cuda_compile.py): the instantiations the wrapper launches (fp32, bf16 state).
#define DS_DECODE_ARGS(ST) const bf16_t*, int, const bf16_t*, int, const bf16_t*, int, const bf16_t*, int, const bf16_t*, bf16_t*, const void*, const void*, const void*, float, ST*, const int*, int*, bf16_t*, int, int, int, float
#define DS_DECODE_INST(ST)                                                                            \
  template __global__ void gdn_decode_kernel<DecodeParams<DS_SM>::warps, ST, DecodeParams<DS_SM>::ctas_per_sm>( \
      DS_DECODE_ARGS(ST));
DS_DECODE_INST(float)
DS_DECODE_INST(bf16_t)
#undef DS_DECODE_INST
#undef DS_DECODE_ARGS
#endif
