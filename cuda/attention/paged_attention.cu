// Paged causal attention over a mixed varlen batch (decodes and prefill chunks in one launch) on
// tensor cores: mma.sync m16n8k16 bf16 -> fp32, ldmatrix and cp.async only, so the same code runs on
// sm_120 (no wgmma / TMA, <= 99 KB of shared memory per block), sm_90 and sm_80.
//
// Work item = (sequence b, kv head hk, query tile, kv split). The G = H / Hkv query heads that share
// kv head hk are packed into the rows of one tile: row r of sequence b is (token r / G, head
// hk G + r % G), so a decode token fills G rows and one K/V tile read from the cache feeds all G
// heads. A CTA has NW warps; warp w owns tile rows 16w..16w+15 (BM = 16 NW) and walks the KV tiles
// of BN keys of its split in order with an online softmax in the exp2 domain (scale * log2 e folded
// into one FMA), fp32 m / l per row, fp32 O accumulators in registers (D / 2 per thread).
//   S = Q K^T : A = Q (ldmatrix from shared memory), B = K rows (ldmatrix, no transpose)
//   O += P V  : A = P repacked from the S accumulators as bf16, B = V rows (ldmatrix .trans)
// K/V tiles stream through a STAGES-deep cp.async ring straight from the paged cache (each 16-key
// segment's block looked up once in block_table; rows past the keys a tile needs are zero filled, so
// a NaN in an unused cache slot never reaches P V). The O rescale is skipped when no row's reference max moved;
// with rescale_slack > 0 (arm attention.lazy_rescale) a max moves only when a tile passes it by more
// than the slack. Shared rows are XOR-swizzled in 16-byte chunks (chunk ^ row % 8), which makes every
// ldmatrix phase and every cp.async write bank-conflict free.
//
// Causality: token j of sequence b sits at num_computed[b] + j and sees keys < min(pos + 1,
// seq_len[b]). A tile only loads keys below its last row's limit; a warp skips the tiles beyond its
// own rows and masks only the tiles that cross its first row's limit. Query tiles are launched last
// tile first (blockIdx.y counts from each sequence's end), so the longest causal tiles start first.
//
// Split-KV (flash decoding): with num_splits > 1, split z of an item takes tiles [z c, (z+1) c) of
// its c = ceil(tiles / num_splits) share, writes O / l in fp32 and lse = m + log2 l per row to a
// workspace, and paged_attn_combine_kernel merges the splits in a fixed order. num_splits comes from
// host ints only and the grid from host upper bounds (max_query_len), so a launch replays in a CUDA
// graph whatever seq_lens hold; CTAs whose tile lies past their sequence exit at once.
//
// Epilogue: out = bf16(O / l), then, with a gate, bf16(out * bf16(sigmoid(gate))) - the rounding
// points of the model's `attn.to(bf16) * torch.sigmoid(gate)`. Deterministic: no atomics, fixed orders.
//
// Layouts: q [T, H, D] bf16 (token / head strides given, 16-byte aligned rows), k_cache / v_cache
// [NB, bs, Hkv, D] bf16 contiguous, block_table [B, M] int32 (row stride given), qsl [B+1],
// seq_lens [B], num_computed [B] int32, gate [T, H, D] bf16 (strides given) or null, out [T, H, D]
// bf16 contiguous; workspace o_part [splits, T, H, D] fp32, lse_part [splits, T, H] fp32.

#include "pa_tiles.cuh"

#define PA_MAX_SPLITS 64  // mirrored by MAX_SPLITS in engine/ops/attention/cuda.py

#include "common/pdl.cuh"
#include "pa_util.cuh"

template <int D, int BN, int NW, int STAGES>
__global__ void __launch_bounds__(NW * 32)
    paged_attn_kernel(const pa::bf16_t* __restrict__ q, const pa::bf16_t* __restrict__ k_cache,
                      const pa::bf16_t* __restrict__ v_cache, const int* __restrict__ block_table,
                      const int* __restrict__ qsl, const int* __restrict__ seq_lens,
                      const int* __restrict__ num_computed, const pa::bf16_t* __restrict__ gate,
                      pa::bf16_t* __restrict__ out, float* __restrict__ o_part, float* __restrict__ lse_part,
                      int num_kv_heads, int group, int q_stride_t, int q_stride_h, int g_stride_t,
                      int g_stride_h, int bt_stride, int log2_bs, int num_splits, int num_tokens,
                      float scale_log2, float rescale_slack) {
  DS_PDL_BEGIN();  // cuda/common/pdl.cuh: before any read of the previous kernels' outputs
  using namespace pa;
  constexpr int BM = 16 * NW, NT = 32 * NW, CPR = D / 8;  // CPR: 16-byte chunks per row
  constexpr int Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2;
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  static_assert(BN % 16 == 0 && NT % CPR == 0 && STAGES >= 2, "tile shape");
  extern __shared__ __align__(128) unsigned char pa_smem[];
  const unsigned s_q = smem_u32(pa_smem);
  const unsigned s_k = s_q + Q_BYTES;            // STAGES tiles of K
  const unsigned s_v = s_k + STAGES * KV_BYTES;  // STAGES tiles of V

  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int b = blockIdx.x / num_kv_heads, hk = blockIdx.x % num_kv_heads;
  const int q0 = qsl[b], rows = (qsl[b + 1] - q0) * group;
  const int n_qtiles = (rows + BM - 1) / BM;
  if ((int)blockIdx.y >= n_qtiles) return;  // the grid is sized by max_query_len
  const int row0 = (n_qtiles - 1 - (int)blockIdx.y) * BM;
  const int seq_len = seq_lens[b], base = num_computed[b];
  const int num_heads = num_kv_heads * group;
  // exclusive key limit of tile row r (rows past the sequence take the last row's: finite, not stored)
  auto limit = [&](int r) { return min(base + min(row0 + r, rows - 1) / group + 1, seq_len); };
  const int kv_end = limit(BM - 1);
  const int n_kv = (kv_end + BN - 1) / BN;
  const int chunk = (n_kv + num_splits - 1) / num_splits;
  const int kt0 = (int)blockIdx.z * chunk, kt1 = min(n_kv, kt0 + chunk);

  // ---- cp.async issue: Q tile once, K/V tiles by stage ----
  const int c_ld = tid % CPR, r_ld = tid / CPR;
  constexpr int R_STEP = NT / CPR;
  for (int r = r_ld; r < BM; r += R_STEP) {
    const int gr = row0 + r;
    const bool ok = gr < rows;
    const int t = ok ? gr / group : 0, g = ok ? gr - t * group : 0;
    const pa::bf16_t* src = q + (size_t)(q0 + t) * q_stride_t + (size_t)(hk * group + g) * q_stride_h + c_ld * 8;
    cp_async16(s_q + swz<D>(r, c_ld), ok ? src : q, ok);
  }
  const int* bt_row = block_table + (size_t)b * bt_stride;
  const int bs_mask = (1 << log2_bs) - 1;
  // A tile (BN keys, BN-aligned, bs >= 16 a power of two) spans at most BN / 16 table entries. They
  // are prefetched into L1 one iteration before the tile's copies are issued, so each cp.async
  // address waits on an L1 hit, not an L2 round trip. (Holding the ids in registers instead made
  // the compiler turn the per-row select into an indexed local-memory array.)
  auto prefetch_blocks = [&](int kt) {
    const int j = tid;
    if (j < BN / 16 && (j == 0 || (j << log2_bs) < BN) && kt * BN + (j << log2_bs) < kv_end)
      asm volatile("prefetch.global.L1 [%0];" ::"l"(bt_row + ((kt * BN) >> log2_bs) + j));
  };
  // This thread copies rows r_ld + R_STEP i of each tile (chunk c_ld). Each 16-row segment of a tile
  // lies inside one cache block, so a segment's block is looked up once and its rows sit a constant
  // stride apart: the per-row work is two 64-bit adds and a compare against a constant (the lookup,
  // shifts and 64-bit multiplies per row were ~2.5 integer instructions per mma of the tile, Nsight
  // Compute, docs/bench-evidence/2026-12-02-s27.md). Rows past kv_end are zero filled from an address
  // inside their segment's block (block 0 for a segment wholly past the end), so no select either.
  static_assert(R_STEP <= 16 && 16 % R_STEP == 0, "a thread's rows must tile the 16-row segments");
  constexpr int SEG_ROWS = 16 / R_STEP;      // this thread's rows in each segment
  const int row_stride = num_kv_heads * D;  // elements from one key to the next
  const size_t lane_off = (size_t)hk * D + c_ld * 8 + (size_t)r_ld * row_stride;
  // the swizzled chunk of row r_ld + R_STEP i is (c_ld ^ r_ld % 8) ^ (R_STEP i % 8): r_ld < R_STEP
  const unsigned dst0 = r_ld * (D * 2), cx = (unsigned)(c_ld ^ (r_ld & 7)) << 4;
  auto load_kv = [&](int kt, int stage) {
    const int left = kv_end - kt * BN - r_ld;  // row i is a key while R_STEP i < left
    const unsigned so0 = stage * KV_BYTES + dst0;
#pragma unroll
    for (int sg = 0; sg < BN / 16; ++sg) {
      const int key0 = kt * BN + 16 * sg;
      const int blk = key0 < kv_end ? bt_row[key0 >> log2_bs] : 0;
      const size_t off = ((((size_t)blk << log2_bs) + (key0 & bs_mask)) * num_kv_heads) * D + lane_off;
      const pa::bf16_t* ks = k_cache + off;
      const pa::bf16_t* vs = v_cache + off;
#pragma unroll
      for (int j = 0; j < SEG_ROWS; ++j) {
        const int i = sg * SEG_ROWS + j;
        const unsigned so = so0 + i * R_STEP * (D * 2) + (cx ^ (unsigned)(((i * R_STEP) & 7) << 4));
        const bool ok = i * R_STEP < left;
        cp_async16(s_k + so, ks + j * R_STEP * row_stride, ok);
        cp_async16(s_v + so, vs + j * R_STEP * row_stride, ok);
      }
    }
  };

  // ---- this thread's two rows (g and g + 8 of its warp's 16) ----
  const int wr = w * 16;
  const bool active = row0 + wr < rows;
  const int lim0 = limit(wr + (lane >> 2)), lim1 = limit(wr + (lane >> 2) + 8);
  const int warp_lo = limit(wr), warp_hi = limit(wr + 15);

  // ldmatrix lane offsets. Every fragment row this lane addresses has row % 8 == lane % 8, so the
  // swizzle only permutes chunks inside each aligned group of 8 (128 bytes): four offsets per operand
  // (chunk pair kk % 4 of the group) plus compile-time immediates. Computing swz() per (kk, n) instead
  // left ~80 hoisted addresses live across the KV loop and spilled at D = 256.
  constexpr int ROW = D * 2;
  unsigned q_off[4], k_off[4], v_off[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r7 = lane & 7;
    q_off[j] = (wr + (lane & 15)) * ROW + (((2 * j + (lane >> 4)) ^ r7) << 4);
    k_off[j] = (r7 + ((lane >> 4) << 3)) * ROW + (((2 * j + ((lane >> 3) & 1)) ^ r7) << 4);
    v_off[j] = (r7 + (((lane >> 3) & 1) << 3)) * ROW + (((2 * j + (lane >> 4)) ^ r7) << 4);
  }

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = neg_inf(), m1 = neg_inf(), l0 = 0.f, l1 = 0.f;
  float s[BN / 8][4];  // this tile's scores, then its probabilities (P)

  // S = Q K^T of the K tile at sk (keys kv0 ..), masked, then the online-softmax update: s becomes P,
  // m / l move, O is rescaled.
  auto scores = [&](unsigned sk, int kv0) {
    // With only BN / 8 = 2 n tiles (BN 16) the D / 16 mma of each accumulator form one dependent
    // chain; CH = 2 interleaves two partial sums (even / odd kk) and halves that latency.
    constexpr int CH = BN <= 16 ? 2 : 1;
    float s2[CH == 2 ? BN / 8 : 1][4];
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int j = 0; j < (CH == 2 ? BN / 8 : 1); ++j) s2[j][0] = s2[j][1] = s2[j][2] = s2[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      unsigned a[4];
      ldsm_x4(s_q + q_off[kk & 3] + (kk >> 2) * 128, a);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        unsigned bk[4];
        ldsm_x4(sk + k_off[kk & 3] + np * 16 * ROW + (kk >> 2) * 128, bk);
        float(*acc)[4] = (CH == 2 && (kk & 1)) ? s2 : s;
        mma_bf16(acc[2 * np], a, bk[0], bk[1]);
        mma_bf16(acc[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    if constexpr (CH == 2) {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] += s2[j][e];
    }
    if (kv0 + BN > warp_lo) {  // the tile crosses some row's causal / length limit
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        const int key = kv0 + nt * 8 + 2 * (lane & 3);
        if (key >= lim0) s[nt][0] = neg_inf();
        if (key + 1 >= lim0) s[nt][1] = neg_inf();
        if (key >= lim1) s[nt][2] = neg_inf();
        if (key + 1 >= lim1) s[nt][3] = neg_inf();
      }
    }
    float mx0 = neg_inf(), mx1 = neg_inf();
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // A row's reference max moves only when the tile's max passes it by more than rescale_slack
    // (log2 units). P = 2^(s - m) then stays <= 2^slack, and O / l is the same quotient: exact in
    // real arithmetic, fewer O rescales in fp32. Slack 0 is the plain online softmax, bit for bit.
    const float c0 = mx0 * scale_log2, c1 = mx1 * scale_log2;
    const float mn0 = c0 > m0 + rescale_slack ? c0 : m0, mn1 = c1 > m1 + rescale_slack ? c1 : m1;
    // a row with nothing visible yet keeps m = -inf; subtracting 0 then gives p = 0, not NaN
    const float mu0 = mn0 == neg_inf() ? 0.f : mn0, mu1 = mn1 == neg_inf() ? 0.f : mn1;
    const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      s[nt][0] = exp2f(fmaf(s[nt][0], scale_log2, -mu0));
      s[nt][1] = exp2f(fmaf(s[nt][1], scale_log2, -mu0));
      s[nt][2] = exp2f(fmaf(s[nt][2], scale_log2, -mu1));
      s[nt][3] = exp2f(fmaf(s[nt][3], scale_log2, -mu1));
      rs0 += s[nt][0] + s[nt][1];
      rs1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * al0 + rs0;  // per-thread partial sums; the quad is reduced once, at the end
    l1 = l1 * al1 + rs1;
    // D / 2 multiplies per thread, as many as the tile's mma at BN = 32: skipped when no row's
    // max moved (alpha is then exactly 1), which most tiles past the first few see
    if (__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) {
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[j][0] *= al0;
        o[j][1] *= al0;
        o[j][2] *= al1;
        o[j][3] *= al1;
      }
    }
  };
  // O += P V with the V tile at sv
  auto accumulate = [&](unsigned sv) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const unsigned a[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        unsigned bv[4];
        ldsm_x4_t(sv + v_off[dp & 3] + kk * 16 * ROW + (dp >> 2) * 128, bv);
        mma_bf16(o[2 * dp], a, bv[0], bv[1]);
        mma_bf16(o[2 * dp + 1], a, bv[2], bv[3]);
      }
    }
  };

  const int n_my = kt1 - kt0;
  // STAGES-deep ring: tiles i+1 .. i+STAGES-1 are in flight while tile i is computed. One group is
  // committed per tile slot (empty past the end) so wait_group counts stay uniform; Q rides in the
  // first.
#pragma unroll
  for (int p = 0; p < STAGES - 1; ++p) {
    if (p < n_my) load_kv(kt0 + p, p);
    cp_async_commit();
  }
  prefetch_blocks(kt0 + STAGES - 1);
  for (int i = 0; i < n_my; ++i) {
    cp_async_wait<STAGES - 2>();  // this thread's copies of tile i (and Q) landed
    __syncthreads();  // everyone's did, and every warp is done with tile i - 1
    if (i + STAGES - 1 < n_my) load_kv(kt0 + i + STAGES - 1, (i + STAGES - 1) % STAGES);
    cp_async_commit();
    prefetch_blocks(kt0 + i + STAGES);  // read by the next iteration's copies
    const int stage = i % STAGES, kv0 = (kt0 + i) * BN;
    if (active && kv0 < warp_hi) {
      scores(s_k + stage * KV_BYTES, kv0);
      accumulate(s_v + stage * KV_BYTES);
    }
  }
  cp_async_wait<0>();  // an empty split still committed its Q group

  if (!active) return;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int gr = row0 + wr + (lane >> 2) + half * 8;
    if (gr >= rows) continue;
    const int t = gr / group, tok = q0 + t, h = hk * group + (gr - t * group);
    const float l = half ? l1 : l0, m = half ? m1 : m0;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const size_t orow = (size_t)tok * num_heads + h;
    if (num_splits == 1) {
      unsigned* dst = reinterpret_cast<unsigned*>(out + orow * D) + (lane & 3);
      if (gate != nullptr) {  // all of the row's gate words are loaded before the first use
        const unsigned* gw = reinterpret_cast<const unsigned*>(gate + (size_t)tok * g_stride_t +
                                                               (size_t)h * g_stride_h) + (lane & 3);
        unsigned gv[D / 8];
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) gv[nt] = gw[nt * 4];
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
          dst[nt * 4] = gated2(o[nt][2 * half] * inv, o[nt][2 * half + 1] * inv, gv[nt]);
      } else {
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
          dst[nt * 4] = pack_bf16x2(o[nt][2 * half] * inv, o[nt][2 * half + 1] * inv);
      }
    } else {
      const size_t prow = (size_t)blockIdx.z * num_tokens * num_heads + orow;
      float2* dst = reinterpret_cast<float2*>(o_part + prow * D);
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt)
        dst[nt * 4 + (lane & 3)] = make_float2(o[nt][2 * half] * inv, o[nt][2 * half + 1] * inv);
      if ((lane & 3) == 0) lse_part[prow] = l > 0.f ? m + log2f(l) : neg_inf();
    }
  }
}

#include "pa_combine.cuh"

#ifdef DELTASERVE_NVCC_CHECK
#define PA_ARGS                                                                                               \
  const pa::bf16_t*, const pa::bf16_t*, const pa::bf16_t*, const int*, const int*, const int*, const int*,   \
      const pa::bf16_t*, pa::bf16_t*, float*, float*, int, int, int, int, int, int, int, int, int, int, float, float
// every instantiation the wrapper can pick on DS_SM: D 64 / 128 / 256, prefill (4 warps, two stages)
// and decode (1 warp, PaDecode stages of 4096 / D keys)
#define PA_PREFILL(D, BN) template __global__ void paged_attn_kernel<D, BN, 4, 2>(PA_ARGS);
#define PA_DEC(D) \
  template __global__ void paged_attn_kernel<D, PaDecode<DS_SM>::kib * 256 / D, 1, PaDecode<DS_SM>::stages>(PA_ARGS);
PA_PREFILL(64, PaTiles<DS_SM>::bn_small)
PA_PREFILL(128, PaTiles<DS_SM>::bn_small)
PA_PREFILL(256, PaTiles<DS_SM>::bn_256)
PA_DEC(64)
PA_DEC(128)
PA_DEC(256)
#undef PA_PREFILL
#undef PA_DEC
#define PA_COMBINE_ARGS const float*, const float*, const pa::bf16_t*, pa::bf16_t*, int, int, int, int, int
// the combine at each head dim for <= 4, <= 16 and <= 64 splits (COMBINE_PER in the wrapper)
#define PA_COMB(D)                                                            \
  template __global__ void paged_attn_combine_kernel<D, 1>(PA_COMBINE_ARGS);  \
  template __global__ void paged_attn_combine_kernel<D, 4>(PA_COMBINE_ARGS);  \
  template __global__ void paged_attn_combine_kernel<D, 16>(PA_COMBINE_ARGS);
PA_COMB(64)
PA_COMB(128)
PA_COMB(256)
#undef PA_COMB
#undef PA_ARGS
#undef PA_COMBINE_ARGS
#endif
