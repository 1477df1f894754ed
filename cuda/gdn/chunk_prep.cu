// Split path of the chunked gated delta rule, pass 1 of 2: the dk-side work of every 64-token chunk,
// all chunks of all sequences in parallel (the one-pass kernel, cuda/gdn/chunk.cu, does this work on
// each CTA's chunk-serial chain; with few sequences that chain is the kernel's whole latency).
//
// One CTA of 8 warps per (key head, chunk): the tile loads, norms and raw products are shared by the
// Nv / Nk value heads of the key head, which then take the gated epilogue, the inverse and the entry
// in turn. With G = cumsum g, r = 1/|k|, Γ = e^{G_i-G_j}, per value head:
//   A   = strictLower(diag(beta) Kn Kn^T ⊙ Γ)                 (raw bf16 K K^T on mma, fp32 epilogue)
//   T   = (I + A)^-1, in fp32: the four 16x16 diagonal blocks by forward substitution (one lane per
//         column), then T_ij = -T_ii sum_{j<=m<i} A_im T_mj by block diagonals (scalar fp32 FMA)
//   Aqk = (Qn Kn^T ⊙ Γ ⊙ lower) q_scale                      (raw bf16 Q K^T on mma, fp32 epilogue)
// and the per-token rows beta, c_x = beta e^G r_k, c_o = e^G r_q q_scale, c_u = r_k e^{G_last - G}
// and G2 (G in log2 units), exactly as chunk.cu computes them. T and Aqk are stored split into bf16
// hi + lo (x = hi + lo to ~2^-17), the operands of the state pass's 3-term products.
// The entry (gdnc::Entry, 34,048 bytes) is staged in shared memory in its global byte order and
// copied out in one linear pass; cuda/gdn/chunk_state.cu reads it back with cp.async as it is.
//
// Layouts as chunk.cu: q, k [T, Nk, 128] bf16 (token stride given, 16-byte aligned), g, beta [T, Nv]
// fp32, qsl [B+1]. Grid (Nk, (T + 63 B) / 64): an upper bound on sum_b ceil(len_b / 64); a CTA past the
// last chunk exits. entries [grid.y][Nv][Entry::BYTES], indexed by (chunk_offset(b) + c, h).
// Deterministic: fixed accumulation order, no atomics.
#include "common/arch_params.cuh"
#include "chunk.cuh"

namespace gdnp {
using gdnc::Entry;
// shared memory in bytes (mirrored by PREP_SMEM in engine/ops/gdn/chunk_split.py): the staged entry
// overlays the K tile (T hi / lo) and the Q tile (Aqk hi / lo), its coefficient rows follow them
struct Smem {
  static constexpr int K = 0, Q = 16384;     // bf16 [64][128], swz<16>
  static constexpr int CF = Entry::CF;       // fp32 [NCF][64]: the entry's rows, then r_k and r_q
  enum { RK = Entry::NROW, RQ, NCF };
  static constexpr int LD = 68;              // fp32 row stride of A and T (+4 floats: bank offset)
  static constexpr int AF = CF + NCF * 256;  // fp32 [64][LD] A (strictly lower)
  static constexpr int TF = AF + 64 * LD * 4;  // fp32 [64][LD] T (lower blocks)
  static constexpr int Y = TF + 64 * LD * 4;   // fp32 [3][16][16] per-diagonal scratch
  static constexpr int BYTES = Y + 3 * 256 * 4;
};
}  // namespace gdnp

__global__ void __launch_bounds__(256, 2)
    gdn_chunk_prep_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const float* __restrict__ g,
                          const float* __restrict__ beta, const int* __restrict__ qsl, int nseq,
                          unsigned char* __restrict__ entries, int nk, int nv, int q_stride, int k_stride,
                          float q_scale) {
  using namespace gdnc;
  using L = gdnp::Smem;
  static_assert(L::BYTES == 72448, "mirrored by PREP_SMEM in engine/ops/gdn/chunk_split.py");
  static_assert(Entry::BYTES == 34048 && Entry::BYTES % 16 == 0, "mirrored by ENTRY_BYTES");
  unsigned char* sm = dyn_smem();
  const unsigned sb = smem_addr(sm);
  float* cf = reinterpret_cast<float*>(sm + L::CF);
  float* af = reinterpret_cast<float*>(sm + L::AF);
  float* tf = reinterpret_cast<float*>(sm + L::TF);
  float* yf = reinterpret_cast<float*>(sm + L::Y);
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int hk = blockIdx.x, e = blockIdx.y, ratio = nv / nk;

  int b = 0, first = 0;  // this CTA's sequence, and the index of its first chunk
  for (; b < nseq; ++b) {
    const int nb = (qsl[b + 1] - qsl[b] + 63) >> 6;
    if (e < first + nb) break;
    first += nb;
  }
  if (b == nseq) return;  // past the last chunk (the grid is an upper bound)
  const int t0 = qsl[b] + 64 * (e - first), n = min(64, qsl[b + 1] - t0);

  const bf16_t* qh = q + hk * 128;
  const bf16_t* kh = k + hk * 128;
  for (int i = tid; i < 64 * 16; i += 256) {
    const int r = i >> 4, ch = i & 15;
    const bool ok = r < n;
    const size_t t = ok ? t0 + r : t0;
    cp16(sb + L::K + swz<16>(r, ch), kh + t * k_stride + ch * 8, ok);
    cp16(sb + L::Q + swz<16>(r, ch), qh + t * q_stride + ch * 8, ok);
  }
  cp_commit();
  cp_wait<0>();
  __syncthreads();

  // ---- 1/|k|, 1/|q| per token (4 lanes per row)
  inv_norms<8>(sm, L::K, L::Q, cf, L::RK, L::RQ, w, gq, tq);
  // ---- raw K K^T and Q K^T on the 20 lower 16x8 tiles each: 5 tiles per warp
  int tm[5], tr[5], tn[5], abase[5], bbase[5];
  float acc[5][4];
#pragma unroll
  for (int i = 0; i < 5; ++i) {
    const int tau = w + 8 * i;
    tm[i] = tau >= 20;
    const int u = tau - 20 * tm[i];
    tr[i] = u >= 12 ? 3 : u >= 6 ? 2 : u >= 2 ? 1 : 0;
    tn[i] = u - tr[i] * (tr[i] + 1);
    abase[i] = (tm[i] ? L::Q : L::K) + tr[i] * 4096;
    bbase[i] = L::K + tn[i] * 2048;
    acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  }
  int oa16[4], ob16[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    oa16[i] = lane_off<16>(lane, true, i);
    ob16[i] = lane_off<16>(lane, false, i);
  }
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int i = 0; i < 5; ++i) {
      unsigned a[4], bb[2];
      ldsm4(sb + abase[i] + oa16[kk & 3] + (kk & 4) * 32, a);
      ldsm2(sb + bbase[i] + ob16[kk & 3] + (kk & 4) * 32, bb);
      mma(acc[i], a, bb[0], bb[1]);
    }
#pragma unroll 1
  for (int hv = 0; hv < ratio; ++hv) {
    const int h = hk * ratio + hv;
    // every warp is done with the K and Q tiles (the entry overwrites them) and with the last value
    // head's entry (its rows are rewritten now)
    __syncthreads();
    if (tid < 64) {  // rows past the sequence end: beta 0 and g 0 (as chunk.cu's zero-filled copies)
      const bool ok = tid < n;
      cf[Entry::BETA * 64 + tid] = ok ? beta[(size_t)(t0 + tid) * nv + h] : 0.f;
      cf[Entry::G2 * 64 + tid] = ok ? g[(size_t)(t0 + tid) * nv + h] : 0.f;
    }
    __syncthreads();
    // ---- cumulative log2 decay (warp 7, in place), then the per-token rows
    if (w == 7) cumsum_log2(cf + Entry::G2 * 64, cf + Entry::G2 * 64, lane);
    __syncthreads();
    const float* G2 = cf + Entry::G2 * 64;
    const float* RK = cf + L::RK * 64;
    const float* BR = cf + Entry::BETA * 64;
    if (tid < 64) {
      const float eg = exp2f(G2[tid]);
      cf[Entry::CX * 64 + tid] = BR[tid] * eg * RK[tid];
      cf[Entry::CO * 64 + tid] = eg * cf[L::RQ * 64 + tid] * q_scale;
      cf[Entry::CU * 64 + tid] = RK[tid] * exp2f(G2[63] - G2[tid]);
    }
    __syncthreads();
    // ---- gated, scaled epilogue: A in fp32 (strictly lower), Aqk split into the staged entry
#pragma unroll
    for (int i = 0; i < 5; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int ii = 16 * tr[i] + gq + 8 * hh, j = 8 * tn[i] + 2 * tq;
        const float d0 = G2[ii] - G2[j], d1 = G2[ii] - G2[j + 1];
        const float x0 = acc[i][2 * hh] * RK[j], x1 = acc[i][2 * hh + 1] * RK[j + 1];
        if (!tm[i]) {
          const float ci = BR[ii] * RK[ii];
          const float a0 = j < ii ? ci * x0 * exp2f(d0) : 0.f;
          const float a1 = j + 1 < ii ? ci * x1 * exp2f(d1) : 0.f;
          *reinterpret_cast<float2*>(af + ii * L::LD + j) = make_float2(a0, a1);
        } else {
          const float ci = q_scale * cf[L::RQ * 64 + ii];
          unsigned hi, lo;
          split2(j <= ii ? ci * x0 * exp2f(d0) : 0.f, j + 1 <= ii ? ci * x1 * exp2f(d1) : 0.f, hi, lo);
          *reinterpret_cast<unsigned*>(sm + Entry::AH + off64(ii, j)) = hi;
          *reinterpret_cast<unsigned*>(sm + Entry::AL + off64(ii, j)) = lo;
        }
      }
    __syncthreads();

    // ---- T_jj = (I + A_jj)^-1: warps 0-1, one lane per column of one diagonal block
    if (w < 2) {
      const int bj = 2 * w + (lane >> 4), col = lane & 15;
      float x[16];
      diag_inverse_column<L::LD>(af + 16 * bj * L::LD + 16 * bj, col, x);
#pragma unroll
      for (int i = 0; i < 16; ++i) tf[(16 * bj + i) * L::LD + 16 * bj + col] = x[i];
    }
    __syncthreads();
    // ---- T_ij = -T_ii (sum_{j<=m<i} A_im T_mj), block diagonal d = i - j = 1, 2, 3 in turn; one
    // thread per element (r, cc) of each 16x16 block
    const int r = tid >> 4, cc = tid & 15;
#pragma unroll 1
    for (int d = 1; d < 4; ++d) {
#pragma unroll 1
      for (int i = d; i < 4; ++i) {
        const int j = i - d;
        float y = 0.f;
        for (int m = j; m < i; ++m)
#pragma unroll
          for (int kq = 0; kq < 16; ++kq)
            y = fmaf(af[(16 * i + r) * L::LD + 16 * m + kq], tf[(16 * m + kq) * L::LD + 16 * j + cc], y);
        yf[j * 256 + r * 16 + cc] = y;
      }
      __syncthreads();
#pragma unroll 1
      for (int i = d; i < 4; ++i) {
        const int j = i - d;
        float t = 0.f;
#pragma unroll
        for (int kq = 0; kq < 16; ++kq) t = fmaf(tf[(16 * i + r) * L::LD + 16 * i + kq], yf[j * 256 + kq * 16 + cc], t);
        tf[(16 * i + r) * L::LD + 16 * j + cc] = -t;
      }
      __syncthreads();
    }
    // ---- T's ten lower blocks as bf16 hi / lo into the staged entry (over the K tile)
    for (int p = tid; p < 64 * 32; p += 256) {
      const int row = p >> 5, col = 2 * (p & 31);
      if ((col >> 4) > (row >> 4)) continue;
      unsigned hi, lo;
      split2(tf[row * L::LD + col], tf[row * L::LD + col + 1], hi, lo);
      *reinterpret_cast<unsigned*>(sm + Entry::TH + off64(row, col)) = hi;
      *reinterpret_cast<unsigned*>(sm + Entry::TL + off64(row, col)) = lo;
    }
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(entries + ((size_t)e * nv + h) * Entry::BYTES);
    const uint4* src = reinterpret_cast<const uint4*>(sm);
    for (int i = tid; i < Entry::BYTES / 16; i += 256) dst[i] = src[i];
  }
}
