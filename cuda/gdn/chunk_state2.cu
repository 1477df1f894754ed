// Split path, pass 2, dk-split variant (arm chunk.dk2): the state pass of cuda/gdn/chunk_state.cu
// with each 16-row dv slab of the state shared by a pair of warps, one per dk half. Per chunk each
// warp takes half of every product along dk (O1 = P Q^T and X = P K^T partials, its half of the
// state update) and one half of the output tokens; the pair exchanges the X partials and the O1
// partials of the other's tokens through shared memory (fp32 adds are commutative, so both warps hold
// the same X bits) and both compute Vn = R T^T. That is 282 mma per warp and chunk instead of 504,
// with twice the warps on the same chain. Notation and precision as chunk_state.cu / chunk.cu.
//
// One CTA per (sequence, value head, 32 dv columns): 4 warps, warp w = 2 wp + half owns dv rows
// 16 wp .. 16 wp + 15 and dk columns 64 half .. 64 half + 63; half 0 stores the output tokens of
// 16-token blocks 0 and 3, half 1 of blocks 1 and 2 (5 of the 10 intra-chunk block products each).
// Pipelining and commit order as chunk_state.cu, plus one pair barrier per chunk.
#include "common/arch_params.cuh"
#include "chunk.cuh"
#include "chunk_state.cuh"
#include "state.cuh"

namespace gdns2 {
using gdnc::Entry;
template <int N>
struct IC {  // a compile-time int for the per-half lambdas (register arrays need static indices)
  static constexpr int value = N;
};
// shared memory in bytes (mirrored by STATE2_SMEM in engine/ops/gdn/chunk_split.py): the one-warp
// pass's layout at dv 32, then the pair exchange buffers
struct Smem : gdns::Smem<32> {
  static constexpr int DVB = 32, NW = 4;
  static constexpr int XB = V + 64 * DVB * 2;  // fp32 [NW][32 values][32 lanes]: X partials
  static constexpr int OB = XB + NW * 4096;    // fp32 [NW][16 values][32 lanes]: the partner's O1 partials
  static constexpr int BYTES = OB + NW * 2048;
};
}  // namespace gdns2

__device__ __forceinline__ void pair_sync(int id) { asm volatile("bar.sync %0, 64;" ::"r"(id) : "memory"); }

template <bool O1LO, typename ST>
__global__ void __launch_bounds__(128, 2)
    gdn_chunk_state2_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                            const unsigned char* __restrict__ entries, ST* __restrict__ state,
                            const int* __restrict__ qsl, const int* __restrict__ slots,
                            const unsigned char* __restrict__ has_init, bf16_t* __restrict__ out, int nk, int nv,
                            int q_stride, int k_stride, int v_stride) {
  using namespace gdnc;
  using gdns2::IC;
  using L = gdns2::Smem;
  constexpr int DVB = L::DVB, NT = L::NW * 32, NB = 128 / DVB, VCPR = DVB / 8;
  static_assert(L::BYTES == 96768, "mirrored by STATE2_SMEM in engine/ops/gdn/chunk_split.py");
  unsigned char* sm = dyn_smem();
  const unsigned sb = smem_addr(sm);
  float* xb = reinterpret_cast<float*>(sm + L::XB);
  float* ob = reinterpret_cast<float*>(sm + L::OB);

  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int wp = w >> 1, half = w & 1, pw = w ^ 1;
  const int h = blockIdx.x / NB, vb = blockIdx.x % NB, b = blockIdx.y;
  const int hk = h / (nv / nk);
  const int t_begin = qsl[b], t_end = qsl[b + 1];
  const int nchunks = (t_end - t_begin + 63) >> 6;
  const int first = chunk_offset(qsl, b);
  const int slot = slots[b];
  const bool live = slot > 0;
  const int dv0 = vb * DVB + 16 * wp, dk0 = 64 * half;
  ST* sp = state + ((size_t)(live ? slot : 0) * nv + h) * (128 * 128);
  const bf16_t* qh = q + hk * 128;
  const bf16_t* kh = k + hk * 128;
  const bf16_t* vh = v + h * 128 + vb * DVB;

  float P[8][4];  // P[nt][e] = S[dk = dk0 + 8 nt + 2 tq + (e & 1)][dv = dv0 + gq + 8 (e >> 1)]
  auto p_at = [&](int nt, int e) { return sp + (dk0 + 8 * nt + 2 * tq + (e & 1)) * 128 + dv0 + gq + 8 * (e >> 1); };
  const bool load = live && has_init[b] != 0;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      P[nt][e] = load ? StateIO<ST>::load1(p_at(nt, e)) : 0.f;

  const gdns::Loads<DVB, NT> ld{sb, qh, kh, vh, entries, first, nv, h, q_stride, k_stride, v_stride, t_begin, t_end, tid};
  if (nchunks > 0) {
    ld.q(0);
    cp_commit();
    ld.tkv(0);
    cp_commit();
  }

  for (int c = 0; c < nchunks; ++c) {
    const int t0 = t_begin + 64 * c, n = min(64, t_end - t0);
    const float* cfc = reinterpret_cast<const float*>(sm + L::CF + (c & 1) * L::CF_BYTES);
    unsigned ah[4], al[4], bf[4], bl[4];
    const unsigned s0 = opaque(sb);
    const int ln = (int)opaque((unsigned)lane);
    int ob16[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) ob16[i] = lane_off<16>(ln, false, i) + 128 * half;  // this warp's dk half
    auto ob8 = [&](int i) { return lane_off<8>((int)opaque((unsigned)lane), false, i); };
    auto oa16 = [&](int i) { return lane_off<16>((int)opaque((unsigned)lane), true, i) + 128 * half; };
    const int ov = lane_off<VCPR>(ln, false, wp);

    cp_wait<1>();  // (a) Q and the rows of this chunk; every warp is past the last chunk's output
    __syncthreads();
    ld.aqk(c);
    cp_commit();
    // ---- O1 partial = P_half Q_half^T, all 64 tokens
    float O1[8][4];
    p_qt<4, O1LO>(O1, P, s0 + L::Q, [&](int i) { return ob16[i]; });
    cp_wait<0>();  // (c) T, K, V and Aqk of this chunk
    __syncthreads();
    if (c + 1 < nchunks) ld.q(c + 1);
    cp_commit();
    // ---- X partial = P_half K_half^T
    float X[8][4];
    p_kt<4>(X, P, s0 + L::K, [&](int i) { return ob16[i]; });
    // ---- exchange with the partner warp: X partials; O1 partials of the partner's token blocks
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) xb[((w * 8 + nt) * 4 + e) * 32 + lane] = X[nt][e];
    auto put_o1 = [&](auto B0, auto B1) {
      constexpr int b0 = decltype(B0)::value, b1 = decltype(B1)::value;
      const int nts[4] = {2 * b0, 2 * b0 + 1, 2 * b1, 2 * b1 + 1};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) ob[((w * 4 + i) * 4 + e) * 32 + lane] = O1[nts[i]][e];
    };
    if (half == 0) {
      put_o1(IC<1>{}, IC<2>{});
    } else {
      put_o1(IC<0>{}, IC<3>{});
    }
    pair_sync(1 + wp);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) X[nt][e] += xb[((pw * 8 + nt) * 4 + e) * 32 + lane];
    float O[4][4];  // this warp's output tiles: blocks (b0, b1), two 8-token tiles each
    auto get_o = [&](auto B0, auto B1) {
      constexpr int b0 = decltype(B0)::value, b1 = decltype(B1)::value;
      const int nts[4] = {2 * b0, 2 * b0 + 1, 2 * b1, 2 * b1 + 1};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) O[i][e] = O1[nts[i]][e] + ob[((pw * 4 + i) * 4 + e) * 32 + lane];
    };
    if (half == 0) {
      get_o(IC<0>{}, IC<3>{});
    } else {
      get_o(IC<1>{}, IC<2>{});
    }
    // ---- R^T = V^T diag(beta) - X diag(c_x); Vn^T = R^T T^T (both warps of the pair); this warp's dk half
    // of the state update
    r_from_x<VCPR>(X, s0 + L::V + ov, cfc + Entry::BETA * 64, cfc + Entry::CX * 64, tq);
    float Vn[8][4];
    gdns::vn_from_r(X, Vn, s0 + L::TH, s0 + L::TL, ob8);
    state_update<4>(P, Vn, s0 + L::K, exp2f(cfc[Entry::G2 * 64 + 63]), cfc + Entry::CU * 64, tq, oa16);
    __syncthreads();  // (e) every warp is done with T, K, V and the exchange buffers
    if (c + 1 < nchunks) ld.tkv(c + 1);
    cp_commit();
    // ---- this warp's output blocks: O^T = O1^T diag(c_o) + Vn^T Aqk^T
    auto out_block = [&](auto PB, float* o0, float* o1) {
      constexpr int p = decltype(PB)::value;
      const float* co = cfc + Entry::CO * 64 + 16 * p + 2 * tq;
      o0[0] *= co[0];
      o0[1] *= co[1];
      o0[2] *= co[0];
      o0[3] *= co[1];
      o1[0] *= co[8];
      o1[1] *= co[9];
      o1[2] *= co[8];
      o1[3] *= co[9];
#pragma unroll
      for (int kb = 0; kb <= p; ++kb) {
        frag_a(Vn[2 * kb], Vn[2 * kb + 1], ah, al);
        ldsm4(s0 + L::AH + ob8(kb) + p * 2048, bf);
        ldsm4(s0 + L::AL + ob8(kb) + p * 2048, bl);
        mma3(o0, ah, al, bf[0], bf[1], bl[0], bl[1]);
        mma3(o1, ah, al, bf[2], bf[3], bl[2], bl[3]);
      }
      store_out_tile(o0, 2 * p, out, t0, n, nv, h, dv0, lane);
      store_out_tile(o1, 2 * p + 1, out, t0, n, nv, h, dv0, lane);
    };
    if (half == 0) {
      out_block(IC<0>{}, O[0], O[1]);
      out_block(IC<3>{}, O[2], O[3]);
    } else {
      out_block(IC<1>{}, O[0], O[1]);
      out_block(IC<2>{}, O[2], O[3]);
    }
  }

  if (live) {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) StateIO<ST>::store1(p_at(nt, e), P[nt][e]);
  }
}

#ifdef DELTASERVE_NVCC_CHECK
#define DS_STATE2_ARGS(ST)                                                                                       \
  const bf16_t*, const bf16_t*, const bf16_t*, const unsigned char*, ST*, const int*, const int*,               \
      const unsigned char*, bf16_t*, int, int, int, int, int
template __global__ void gdn_chunk_state2_kernel<true, float>(DS_STATE2_ARGS(float));
template __global__ void gdn_chunk_state2_kernel<false, float>(DS_STATE2_ARGS(float));
template __global__ void gdn_chunk_state2_kernel<true, bf16_t>(DS_STATE2_ARGS(bf16_t));
#undef DS_STATE2_ARGS
#endif
