// What the two state passes of the split path (cuda/gdn/chunk_state.cu, chunk_state2.cu) share:
// the shared-memory layout, the per-chunk tile loads from the prep pass's entries and the q / k / v
// buffers, and Vn = R T^T (notation: chunk.cu's header; the phases all three kernels share are in
// chunk.cuh). Every function is inlined.
#pragma once

#include "chunk.cuh"

namespace gdns {
using gdnc::Entry;

// shared memory in bytes (mirrored by state_smem_bytes() in engine/ops/gdn/chunk_split.py); T and Aqk
// sit in the entry's own order so each copies as one linear range
template <int DVB>
struct Smem {
  static constexpr int Q = 0, K = 16384;       // bf16 [64][128], swz<16>
  static constexpr int TH = 32768, TL = TH + Entry::TL, AH = TH + Entry::AH, AL = TH + Entry::AL;
  static constexpr int CF = TH + Entry::CF;    // fp32 [2 parity][Entry::NROW][64]
  static constexpr int CF_BYTES = Entry::NROW * 256;
  static constexpr int V = CF + 2 * CF_BYTES;  // bf16 [64][DVB]
  static constexpr int BYTES = V + 64 * DVB * 2;
};

// One CTA's cp.async loads of chunk c, NT threads, DVB value columns (the copy index math uses an
// opaque tid so that it is not hoisted out of the chunk loop).
template <int DVB, int NT>
struct Loads {
  using L = Smem<DVB>;
  static constexpr int VCPR = DVB / 8;
  unsigned sb;
  const bf16_t *qh, *kh, *vh;
  const unsigned char* entries;
  int first, nv, h, q_stride, k_stride, v_stride, t_begin, t_end, tid;

  __device__ __forceinline__ const unsigned char* entry(int c) const {
    return entries + ((size_t)(first + c) * nv + h) * Entry::BYTES;
  }
  __device__ __forceinline__ void q(int c) const {  // Q tile and the entry's rows
    using namespace gdnc;
    const int t0 = t_begin + 64 * c, n = min(64, t_end - t0), ti = (int)opaque((unsigned)tid);
    for (int i = ti; i < 64 * 16; i += NT) {
      const int r = i >> 4, ch = i & 15;
      const bool ok = r < n;
      cp16(sb + L::Q + swz<16>(r, ch), qh + (size_t)(ok ? t0 + r : t_begin) * q_stride + ch * 8, ok);
    }
    const unsigned char* src = entry(c) + Entry::CF;
    for (int i = ti; i < L::CF_BYTES / 16; i += NT) cp16(sb + L::CF + (c & 1) * L::CF_BYTES + 16 * i, src + 16 * i, true);
  }
  __device__ __forceinline__ void aqk(int c) const {  // Aqk hi and lo
    using namespace gdnc;
    const unsigned char* src = entry(c) + Entry::AH;
    for (int i = (int)opaque((unsigned)tid); i < 16384 / 16; i += NT) cp16(sb + L::AH + 16 * i, src + 16 * i, true);
  }
  __device__ __forceinline__ void tkv(int c) const {  // T hi and lo, K and V tiles
    using namespace gdnc;
    const int t0 = t_begin + 64 * c, n = min(64, t_end - t0), ti = (int)opaque((unsigned)tid);
    const unsigned char* src = entry(c) + Entry::TH;
    for (int i = ti; i < 16384 / 16; i += NT) cp16(sb + L::TH + 16 * i, src + 16 * i, true);
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
  }
};

// Vn^T = R^T T^T: source block kb feeds every output block j >= kb (th / tl: the T hi / lo tiles,
// ob8(kb): this lane's ldmatrix offset of chunk pair kb).
template <typename OB8>
__device__ __forceinline__ void vn_from_r(const float (*X)[4], float (*Vn)[4], unsigned th, unsigned tl, OB8 ob8) {
  using namespace gdnc;
  unsigned ah[4], al[4], bf[4], bl[4];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) Vn[nt][0] = Vn[nt][1] = Vn[nt][2] = Vn[nt][3] = 0.f;
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    frag_a(X[2 * kb], X[2 * kb + 1], ah, al);
#pragma unroll
    for (int j = kb; j < 4; ++j) {
      ldsm4(th + ob8(kb) + j * 2048, bf);
      ldsm4(tl + ob8(kb) + j * 2048, bl);
      mma3(Vn[2 * j], ah, al, bf[0], bf[1], bl[0], bl[1]);
      mma3(Vn[2 * j + 1], ah, al, bf[2], bf[3], bl[2], bl[3]);
    }
  }
}

}  // namespace gdns
