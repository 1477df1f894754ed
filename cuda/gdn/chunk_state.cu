// Split path of the chunked gated delta rule, pass 2 of 2: the state pass. Each chunk's dk-side
// operands (T = (I + A)^-1, the gated Q K^T, the per-token rows) come ready from
// cuda/gdn/chunk_prep.cu, so the chunk-serial chain of one CTA holds only the state-side products:
//   O1^T  = P Q^T                                   (the state from before the chunk)
//   R^T   = V^T diag(beta) - (P K^T) diag(c_x)
//   Vn^T  = R^T T^T                                 (four independent 16-token block columns: no
//                                                     substitution chain, unlike chunk.cu)
//   P    <- e^{G_last} P + Vn^T diag(c_u) K
//   O^T   = O1^T diag(c_o) + Vn^T Aqk^T
// with P = S^T [dv x dk] held as fp32 mma accumulators, warp w owning dv rows 16w..16w+15 (as in
// chunk.cu, whose header has the notation). Precision as there: computed operands are split into
// bf16 hi + lo and the products take hi*B + lo*B (+ hi*Blo where B is computed: T and Aqk).
//
// One CTA per (sequence, value head, dv block of DVB columns), NW = DVB / 16 warps; unlike chunk.cu
// a smaller dv block repeats no dk-side work (only the tile loads), so DVB is one per-arch row.
// Pipelining: every tile is single-buffered and refilled by cp.async once its last reader has passed
// one of the chunk's three barriers. Commit order per chunk c: (a) Aqk_c, (c) Q_{c+1} with its rows,
// (e) T_{c+1}, K_{c+1}, V_{c+1}; the rows are double-buffered by chunk parity.
//
// Layouts as chunk.cu (q, k, v, state, out, qsl, slots, has_init); entries as chunk_prep.cu.
#include "common/arch_params.cuh"
#include "chunk.cuh"
#include "chunk_state.cuh"
#include "state.cuh"

// Per-arch tuning rows, parsed by engine/ops/gdn/chunk_split.py: (SM, DVB, MIN_CHUNKS). DVB is the
// state pass's dv block (on the H200 dv 64 was fastest or level at every few-sequence shape: dv 32
// doubles each chunk's tile traffic per warp, dv 128 leaves multiprocessors idle); the split path runs
// only when the longest sequence has at least MIN_CHUNKS chunks (below that the prep pass costs more
// than the chain it takes off). Timings: docs/bench-evidence/2026-12-01-chunk-split.md. Not measured
// on sm_120 / sm_80: same rows until they are.
#define GDN_STATE_TABLE(X) \
  X(80, 64, 8)             \
  X(90, 64, 8)             \
  X(120, 64, 8)

template <int SM>
struct StateParams;
#define GDN_STATE_ROW(SM, DVB, MIN_CHUNKS)   \
  template <>                                \
  struct StateParams<SM> {                   \
    static constexpr int dvb = DVB;          \
    static constexpr int min_chunks = MIN_CHUNKS; \
  };
GDN_STATE_TABLE(GDN_STATE_ROW)
#undef GDN_STATE_ROW


template <int DVB, bool O1LO, typename ST>
__global__ void __launch_bounds__(DVB * 2, 1)
    gdn_chunk_state_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                           const unsigned char* __restrict__ entries, ST* __restrict__ state,
                           const int* __restrict__ qsl, const int* __restrict__ slots,
                           const unsigned char* __restrict__ has_init, bf16_t* __restrict__ out, int nk, int nv,
                           int q_stride, int k_stride, int v_stride) {
  using namespace gdnc;
  using gdns::Entry;
  using L = gdns::Smem<DVB>;
  constexpr int NW = DVB / 16, NT = NW * 32, NB = 128 / DVB, VCPR = DVB / 8;
  static_assert(DVB == 32 || DVB == 64 || DVB == 128, "dv block of 32, 64 or 128");
  static_assert(L::BYTES == 68096 + 128 * DVB, "mirrored by state_smem_bytes() in engine/ops/gdn/chunk_split.py");
  unsigned char* sm = dyn_smem();
  const unsigned sb = smem_addr(sm);

  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int h = blockIdx.x / NB, vb = blockIdx.x % NB, b = blockIdx.y;
  const int hk = h / (nv / nk);
  const int t_begin = qsl[b], t_end = qsl[b + 1];
  const int nchunks = (t_end - t_begin + 63) >> 6;
  const int first = chunk_offset(qsl, b);
  const int slot = slots[b];
  const bool live = slot > 0;
  const int dv0 = vb * DVB + 16 * w;
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
    for (int i = 0; i < 4; ++i) ob16[i] = lane_off<16>(ln, false, i);
    // the other lane offsets are computed where they are used (held across the chunk, they spilled)
    auto ob8 = [&](int i) { return lane_off<8>((int)opaque((unsigned)lane), false, i); };
    auto oa16 = [&](int i) { return lane_off<16>((int)opaque((unsigned)lane), true, i); };
    const int ov = lane_off<VCPR>(ln, false, w);

    cp_wait<1>();  // (a) Q and the rows of this chunk; every warp is past the last chunk's output
    __syncthreads();
    ld.aqk(c);
    cp_commit();
    // ---- O1 = P Q^T (tokens along n) with the state from before this chunk
    float O[8][4];
    p_qt<8, O1LO>(O, P, s0 + L::Q, [&](int i) { return ob16[i]; });
    cp_wait<0>();  // (c) T, K, V and Aqk of this chunk
    __syncthreads();
    if (c + 1 < nchunks) ld.q(c + 1);  // every warp is done with Q
    cp_commit();
    // ---- R^T = V^T diag(beta) - (P K^T) diag(c_x)
    float X[8][4];
    p_kt<8>(X, P, s0 + L::K, [&](int i) { return ob16[i]; });
    r_from_x<VCPR>(X, s0 + L::V + ov, cfc + Entry::BETA * 64, cfc + Entry::CX * 64, tq);
    float Vn[8][4];
    gdns::vn_from_r(X, Vn, s0 + L::TH, s0 + L::TL, ob8);
    // ---- P <- e^{G_last} P + (Vn diag(c_u)) K
    state_update<8>(P, Vn, s0 + L::K, exp2f(cfc[Entry::G2 * 64 + 63]), cfc + Entry::CU * 64, tq, oa16);
    __syncthreads();  // (e) every warp is done with T, K and V
    if (c + 1 < nchunks) ld.tkv(c + 1);
    cp_commit();
    // ---- O^T = O1^T diag(c_o) + Vn^T Aqk^T, stored as bf16 rows of the output
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float* co = cfc + Entry::CO * 64 + 8 * nt + 2 * tq;
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
        ldsm4(s0 + L::AH + ob8(kb) + p * 2048, bf);
        ldsm4(s0 + L::AL + ob8(kb) + p * 2048, bl);
        mma3(O[2 * p], ah, al, bf[0], bf[1], bl[0], bl[1]);
        mma3(O[2 * p + 1], ah, al, bf[2], bf[3], bl[2], bl[3]);
      }
    store_out_rows(O, out, t0, n, nv, h, dv0, lane);
  }

  if (live) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) StateIO<ST>::store1(p_at(nt, e), P[nt][e]);
  }
}

#ifdef DELTASERVE_NVCC_CHECK
#define DS_STATE_ARGS(ST)                                                                                        \
  const bf16_t*, const bf16_t*, const bf16_t*, const unsigned char*, ST*, const int*, const int*,               \
      const unsigned char*, bf16_t*, int, int, int, int, int
// every dv block the wrapper can pick, fp32 and bf16 state; the o1hi arm at dv 64
#define DS_STATE_INST(ST)                                                               \
  template __global__ void gdn_chunk_state_kernel<128, true, ST>(DS_STATE_ARGS(ST));  \
  template __global__ void gdn_chunk_state_kernel<64, true, ST>(DS_STATE_ARGS(ST));   \
  template __global__ void gdn_chunk_state_kernel<32, true, ST>(DS_STATE_ARGS(ST));   \
  template __global__ void gdn_chunk_state_kernel<64, false, ST>(DS_STATE_ARGS(ST));
DS_STATE_INST(float)
DS_STATE_INST(bf16_t)
#undef DS_STATE_INST
#undef DS_STATE_ARGS
static_assert(StateParams<DS_SM>::dvb >= 32 && StateParams<DS_SM>::dvb <= 128, "dv blocks 32..128");
#endif
