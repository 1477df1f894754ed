// Chunked gated delta rule (varlen prefill) on tensor cores: mma.sync m16n8k16 bf16 -> fp32,
// ldmatrix and cp.async only, so the same code runs on sm_120 (no wgmma / TMA), sm_90 and sm_80.
//
// One CTA per (sequence, value head, dv block of DVB columns) walks the sequence's 64-token chunks
// in order; NW = DVB / 16 warps. The state is held transposed, P = S^T [dv x dk], as fp32 mma
// accumulators: warp w owns dv rows 16w..16w+15 and all 128 dk columns (64 registers). In that
// orientation every state-path product has dv as its M dimension, so each warp's operands are its
// own accumulators (accumulator -> A fragment is a register repack) or tiles in shared memory, and
// warps never exchange state. Per chunk (G = cumsum g, c_x = beta e^G rk, r = 1/|k|, Γ = e^{G_i-G_j}):
//   M = I + A, A = strictLower(diag(beta) Kn Kn^T ⊙ Γ)            fp32 epilogue of raw K K^T (mma)
//   R^T = V^T diag(beta) - (P K^T) diag(c_x)                          raw bf16 K is exact in mma
//   V_new^T = R^T M^-T: blockwise forward substitution over 16-token blocks; the four 16x16 diagonal
//     blocks are inverted in fp32 (one lane per column); all other work is mma on -A blocks
//   O^T = (P Q^T) diag(e^G rq scale) + V_new^T (Qn Kn^T ⊙ Γ ⊙ lower)^T
//   P <- e^{G_last} P + V_new^T diag(rk e^{G_last - G}) K
// The gate stays inside A (entries <= |A| since Γ <= 1: nothing grows), and the unnormalised bf16
// inputs are the mma operands (exact); the norms enter as per-token fp32 scales.
//
// Precision: every fp32 operand that is not raw input is split into bf16 hi + lo and the products
// take hi*B + lo*B (+ hi*Blo where B is itself computed); why, and what it costs: docs/kernels.md.
//
// Pipelining: K/Q/V tiles are single-buffered (99 KB budget on sm_120: 88.6 KB at DVB=128) and
// refilled by cp.async as soon as their last reader has passed a barrier: Q_{c+1} (+ g, beta) right
// after the gated K K^T / Q K^T epilogue, K_{c+1} and V_{c+1} after the state update; the next chunk
// starts with P Q^T, which needs Q only, so the K/V loads overlap the intra-chunk output and P Q^T.
// Grid: (Nv * 128 / DVB, B). DVB = 128 at W1 (1024 CTAs, ~7.8 per H200 SM, one resident at a time:
// ~250 registers x 256 threads); fewer sequences split dv (64, 32), each CTA recomputing the dk side.
// Deterministic: fixed accumulation order everywhere, no atomics.
//
// Measured timings, the cycle profile and the variants tried: docs/kernels.md.
//
// Layouts (as cuda/gdn/recurrent.cu): q, k [T, Nk, 128] bf16 (token stride given, 16-byte aligned),
// v [T, Nv, 128] bf16 (token stride given), g, beta [T, Nv] fp32, state [S, Nv, 128 dk, 128 dv] ST
// (fp32 or bf16: state.cuh; P stays fp32 across all chunks, a bf16 state is rounded once, at the end),
// out [T, Nv, 128] bf16, qsl [B+1], slots [B] int32 (<= 0: padding, state neither read nor written),
// has_init [B] u8.
#include "common/arch_params.cuh"
#include "chunk.cuh"
#include "state.cuh"

// Per-arch tuning rows, parsed by engine/ops/gdn/chunk.py: (SM, DVB_MAX, DVB_MIN). The wrapper uses
// the largest dv block in [DVB_MIN, DVB_MAX] that still gives one CTA per multiprocessor (the H200
// timings behind these rows: docs/kernels.md). Not measured on sm_120 / sm_80: same rows until they are.
#define GDN_CHUNK_TABLE(X) \
  X(80, 128, 64)           \
  X(90, 128, 64)           \
  X(120, 128, 64)

template <int SM>
struct ChunkParams;
#define GDN_CHUNK_ROW(SM, DVB_MAX, DVB_MIN)     \
  template <>                                   \
  struct ChunkParams<SM> {                      \
    static constexpr int dvb_max = DVB_MAX;     \
    static constexpr int dvb_min = DVB_MIN;     \
  };
GDN_CHUNK_TABLE(GDN_CHUNK_ROW)
#undef GDN_CHUNK_ROW

template <int DVB, bool O1LO, typename ST>
__global__ void __launch_bounds__(DVB * 2, 1)
    gdn_chunk_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                     const float* __restrict__ g, const float* __restrict__ beta, ST* __restrict__ state,
                     const int* __restrict__ qsl, const int* __restrict__ slots,
                     const unsigned char* __restrict__ has_init, bf16_t* __restrict__ out, int nk, int nv,
                     int q_stride, int k_stride, int v_stride, float q_scale) {
  using namespace gdnc;
  using L = Smem<DVB>;
  constexpr int NW = DVB / 16, NT = NW * 32, NB = 128 / DVB, VCPR = DVB / 8;
  static_assert(DVB == 32 || DVB == 64 || DVB == 128, "dv block of 32, 64 or 128");
  static_assert(L::BYTES == 72256 + 128 * DVB, "mirrored by smem_bytes() in engine/ops/gdn/chunk.py");
  unsigned char* sm = dyn_smem();
  const unsigned sb = smem_addr(sm);
  float* cf = reinterpret_cast<float*>(sm + L::CF);
  float* ad = reinterpret_cast<float*>(sm + L::AD);
  const float* raw = reinterpret_cast<const float*>(sm + L::RAW);

  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int h = blockIdx.x / NB, vb = blockIdx.x % NB, b = blockIdx.y;
  const int hk = h / (nv / nk);
  const int t_begin = qsl[b], t_end = qsl[b + 1];
  const int nchunks = (t_end - t_begin + 63) >> 6;
  const int slot = slots[b];
  const bool live = slot > 0;
  const int dv0 = vb * DVB + 16 * w;  // first dv column of this warp's 16 state rows
  ST* sp = state + ((size_t)(live ? slot : 0) * nv + h) * (128 * 128);
  const bf16_t* qh = q + hk * 128;
  const bf16_t* kh = k + hk * 128;
  const bf16_t* vh = v + h * 128 + vb * DVB;

  float P[16][4];  // P[nt][e] = S[dk = 8 nt + 2 tq + (e & 1)][dv = dv0 + gq + 8 (e >> 1)]
  auto p_at = [&](int nt, int e) { return sp + (8 * nt + 2 * tq + (e & 1)) * 128 + dv0 + gq + 8 * (e >> 1); };
  const bool load = live && has_init[b] != 0;
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      P[nt][e] = load ? StateIO<ST>::load1(p_at(nt, e)) : 0.f;

  // (the copy index math uses an opaque tid so that it is not hoisted out of the chunk loop)
  auto issue_q = [&](int c) {  // Q tile, g and beta of chunk c
    const int t0 = t_begin + 64 * c, n = min(64, t_end - t0), ti = (int)opaque((unsigned)tid);
    for (int i = ti; i < 64 * 16; i += NT) {
      const int r = i >> 4, ch = i & 15;
      const bool ok = r < n;
      cp16(sb + L::Q + swz<16>(r, ch), qh + (size_t)(ok ? t0 + r : t_begin) * q_stride + ch * 8, ok);
    }
    for (int i = ti; i < 128; i += NT) {
      const int r = i & 63, isb = i >> 6;
      const bool ok = r < n;
      cp4(sb + L::RAW + (((c & 1) * 2 + isb) * 64 + r) * 4, (isb ? beta : g) + (size_t)(ok ? t0 + r : t_begin) * nv + h,
          ok);
    }
  };
  auto issue_kv = [&](int c) {  // K and V tiles of chunk c
    const int t0 = t_begin + 64 * c, n = min(64, t_end - t0), ti = (int)opaque((unsigned)tid);
    for (int i = ti; i < 64 * 16; i += NT) {
      const int r = i >> 4, ch = i & 15;
      const bool ok = r < n;
      cp16(sb + L::K + swz<16>(r, ch), kh + (size_t)(ok ? t0 + r : t_begin) * k_stride + ch * 8, ok);
    }
    for (int i = ti; i < 64 * VCPR; i += NT) {
      const int r = i / VCPR, ch = i % VCPR;
      const bool ok = r < n;
      cp16(sb + L::V + swz<VCPR>(r, ch), vh + (size_t)(ok ? t0 + r : t_begin) * v_stride + ch * 8, ok);
    }
  };
  if (nchunks > 0) {
    issue_q(0);
    cp_commit();
    issue_kv(0);
    cp_commit();
  }

  for (int c = 0; c < nchunks; ++c) {
    const int t0 = t_begin + 64 * c, n = min(64, t_end - t0);
    const float* graw = raw + (c & 1) * 128;
    const float* braw = graw + 64;
    unsigned ah[4], al[4], bf[4], bl[4];
    const unsigned s0 = opaque(sb);
    // per-lane ldmatrix offsets, recomputed per chunk (cheap) rather than held across the loop
    const int ln = (int)opaque((unsigned)lane);
    int oa16[4], ob16[4], ob8[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      oa16[i] = lane_off<16>(ln, true, i);
      ob16[i] = lane_off<16>(ln, false, i);
      ob8[i] = lane_off<8>(ln, false, i);
    }
    const int ov = lane_off<VCPR>(ln, false, w);  // V^T fragments of this warp's 16 dv columns

    GDNC_MARK(0);
    cp_wait<1>();  // Q, g, beta of this chunk
    __syncthreads();
    GDNC_MARK(1);
    // ---- O1 = P Q^T (tokens along n) with the state from before this chunk
    float O[8][4];
    p_qt<8, O1LO>(O, P, s0 + L::Q, [&](int i) { return ob16[i]; });
    GDNC_MARK(2);
    cp_wait<0>();  // K, V
    __syncthreads();
    GDNC_MARK(3);
    // ---- 1/|k|, 1/|q| per token (4 lanes per row), cumulative log2 decay
    inv_norms<NW>(sm, L::K, L::Q, cf, CF_RK, CF_RQ, w, gq, tq);
    if (w == NW - 1) cumsum_log2(graw, cf + CF_G2 * 64, lane);
    __syncthreads();
    const float* G2 = cf + CF_G2 * 64;
    const float* RK = cf + CF_RK * 64;
    if (tid < 64) {
      const float eg = exp2f(G2[tid]);
      cf[CF_CX * 64 + tid] = braw[tid] * eg * RK[tid];
      cf[CF_CO * 64 + tid] = eg * cf[CF_RQ * 64 + tid] * q_scale;
      cf[CF_CU * 64 + tid] = RK[tid] * exp2f(G2[63] - G2[tid]);
    }
    GDNC_MARK(4);
    // ---- raw K K^T and Q K^T on the 20 lower 16x8 tiles each; gated, scaled, split epilogue
#pragma unroll 1
    for (int grp = 0; grp < 40 / (5 * NW); ++grp) {
      int tm[5], tr[5], tn[5], abase[5], bbase[5];
      float acc[5][4];
      const int wq = (int)opaque((unsigned)w);
#pragma unroll
      for (int i = 0; i < 5; ++i) {
        const int tau = wq + NW * (5 * grp + i);
        tm[i] = tau >= 20;
        const int u = tau - 20 * tm[i];
        tr[i] = u >= 12 ? 3 : u >= 6 ? 2 : u >= 2 ? 1 : 0;
        tn[i] = u - tr[i] * (tr[i] + 1);
        abase[i] = (tm[i] ? L::Q : L::K) + tr[i] * 4096;
        bbase[i] = L::K + tn[i] * 2048;
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
#pragma unroll
        for (int i = 0; i < 5; ++i) {
          unsigned a[4], bb[2];
          ldsm4(s0 + abase[i] + oa16[kk & 3] + (kk & 4) * 32, a);
          ldsm2(s0 + bbase[i] + ob16[kk & 3] + (kk & 4) * 32, bb);
          mma(acc[i], a, bb[0], bb[1]);
        }
#pragma unroll
      for (int i = 0; i < 5; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int ii = 16 * tr[i] + gq + 8 * hh, j = 8 * tn[i] + 2 * tq;
          const float d0 = G2[ii] - G2[j], d1 = G2[ii] - G2[j + 1];
          const float x0 = acc[i][2 * hh] * RK[j], x1 = acc[i][2 * hh + 1] * RK[j + 1];
          unsigned hi, lo;
          if (!tm[i]) {
            const float ci = braw[ii] * RK[ii];
            const float a0 = j < ii ? ci * x0 * exp2f(d0) : 0.f;
            const float a1 = j + 1 < ii ? ci * x1 * exp2f(d1) : 0.f;
            if ((tn[i] >> 1) == tr[i]) {
              *reinterpret_cast<float2*>(ad + tr[i] * L::AD_STRIDE + (ii & 15) * 16 + (j & 15)) = make_float2(a0, a1);
            } else {
              split2(-a0, -a1, hi, lo);
              *reinterpret_cast<unsigned*>(sm + L::MH + off64(ii, j)) = hi;
              *reinterpret_cast<unsigned*>(sm + L::ML + off64(ii, j)) = lo;
            }
          } else {
            const float ci = q_scale * cf[CF_RQ * 64 + ii];
            split2(j <= ii ? ci * x0 * exp2f(d0) : 0.f, j + 1 <= ii ? ci * x1 * exp2f(d1) : 0.f, hi, lo);
            *reinterpret_cast<unsigned*>(sm + L::AH + off64(ii, j)) = hi;
            *reinterpret_cast<unsigned*>(sm + L::AL + off64(ii, j)) = lo;
          }
        }
    }
    GDNC_MARK(5);
    __syncthreads();
    if (c + 1 < nchunks) issue_q(c + 1);  // Q, g, beta (other parity) are free now
    cp_commit();
    GDNC_MARK(6);
    // ---- T_jj = (I + A_jj)^-1 in fp32: warps 0-1, one lane per column of one diagonal block
    if (w < 2) invert_diag_blocks<L::AD_STRIDE, L::MH, L::ML>(sm, ad, w, lane);
    GDNC_MARK(7);
    // ---- R^T = V^T diag(beta) - (P K^T) diag(c_x)
    float X[8][4];
    p_kt<8>(X, P, s0 + L::K, [&](int i) { return ob16[i]; });
    r_from_x<VCPR>(X, s0 + L::V + ov, braw, cf + CF_CX * 64, tq);
    GDNC_MARK(8);
    __syncthreads();
    GDNC_MARK(9);
    // ---- V_new^T by blocks: Y_j = R_j + sum_{kb<j} Vn_kb (-A_j,kb)^T, Vn_j = Y_j T_jj^T
    float Vn[8][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int kb = 0; kb < j; ++kb) {
        frag_a(Vn[2 * kb], Vn[2 * kb + 1], ah, al);
        ldsm4(s0 + L::MH + ob8[kb] + j * 2048, bf);
        ldsm4(s0 + L::ML + ob8[kb] + j * 2048, bl);
        mma3(X[2 * j], ah, al, bf[0], bf[1], bl[0], bl[1]);
        mma3(X[2 * j + 1], ah, al, bf[2], bf[3], bl[2], bl[3]);
      }
      frag_a(X[2 * j], X[2 * j + 1], ah, al);
      ldsm4(s0 + L::MH + ob8[j] + j * 2048, bf);
      ldsm4(s0 + L::ML + ob8[j] + j * 2048, bl);
#pragma unroll
      for (int e = 0; e < 4; ++e) Vn[2 * j][e] = Vn[2 * j + 1][e] = 0.f;
      mma3(Vn[2 * j], ah, al, bf[0], bf[1], bl[0], bl[1]);
      mma3(Vn[2 * j + 1], ah, al, bf[2], bf[3], bl[2], bl[3]);
    }
    GDNC_MARK(10);
    // ---- P <- e^{G_last} P + (Vn diag(c_u)) K   (K rows are tokens: B fragments via .trans)
    state_update<8>(P, Vn, s0 + L::K, exp2f(G2[63]), cf + CF_CU * 64, tq, [&](int i) { return oa16[i]; });
    GDNC_MARK(11);
    __syncthreads();
    if (c + 1 < nchunks) issue_kv(c + 1);  // every warp is done with K and V
    cp_commit();
    GDNC_MARK(12);
    // ---- O^T = O1^T diag(c_o) + Vn^T (Qn Kn^T ⊙ Γ)^T, stored as bf16 rows of the output
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float* co = cf + CF_CO * 64 + 8 * nt + 2 * tq;
      O[nt][0] *= co[0];
      O[nt][1] *= co[1];
      O[nt][2] *= co[0];
      O[nt][3] *= co[1];
    }
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
      for (int kb = 0; kb <= p; ++kb) {
        frag_a(Vn[2 * kb], Vn[2 * kb + 1], ah, al);
        ldsm4(s0 + L::AH + ob8[kb] + p * 2048, bf);
        ldsm4(s0 + L::AL + ob8[kb] + p * 2048, bl);
        mma3(O[2 * p], ah, al, bf[0], bf[1], bl[0], bl[1]);
        mma3(O[2 * p + 1], ah, al, bf[2], bf[3], bl[2], bl[3]);
      }
    store_out_rows(O, out, t0, n, nv, h, dv0, lane);
    GDNC_MARK(13);
  }

  if (live) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) StateIO<ST>::store1(p_at(nt, e), P[nt][e]);
  }
}

#ifdef DELTASERVE_NVCC_CHECK
#define DS_CHUNK_ARGS(ST)                                                                                             \
  const bf16_t*, const bf16_t*, const bf16_t*, const float*, const float*, ST*, const int*, const int*,              \
      const unsigned char*, bf16_t*, int, int, int, int, int, float
// every dv block the wrapper can pick (32 only through the chunk.dv32 arm), and the o1hi arm; fp32 and
// bf16 state (the same instantiations for both)
#define DS_CHUNK_INST(ST)                                                          \
  template __global__ void gdn_chunk_kernel<128, true, ST>(DS_CHUNK_ARGS(ST));  \
  template __global__ void gdn_chunk_kernel<64, true, ST>(DS_CHUNK_ARGS(ST));   \
  template __global__ void gdn_chunk_kernel<32, true, ST>(DS_CHUNK_ARGS(ST));   \
  template __global__ void gdn_chunk_kernel<128, false, ST>(DS_CHUNK_ARGS(ST));
DS_CHUNK_INST(float)
DS_CHUNK_INST(bf16_t)
#undef DS_CHUNK_INST
static_assert(ChunkParams<DS_SM>::dvb_min >= 32 && ChunkParams<DS_SM>::dvb_max <= 128, "dv blocks 32..128");
#undef DS_CHUNK_ARGS
#endif
