// Helpers of cuda/gdn/chunk.cu: the mma.sync / ldmatrix / cp.async wrappers (PTX only: sm_80, sm_90,
// sm_120 alike; the section between the "ptx helpers" markers is all the inline PTX of the kernel),
// the shared-memory layout, the diagonal-block inversion and the optional profile marks.
#pragma once

namespace gdnc {

// ---- ptx helpers begin ----
__device__ __forceinline__ unsigned char* dyn_smem() {
  extern __shared__ __align__(16) unsigned char gdnc_smem[];
  return gdnc_smem;
}
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void ldsm4(unsigned a, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm4t(unsigned a, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm2(unsigned a, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
// c += a * b for one 16x8 tile: a = 16x16 row-major A fragment, (b0, b1) = 16x8 B fragment
__device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// cp.async with zero fill when !ok (the source address is then never read but kept valid anyway)
__device__ __forceinline__ void cp16(unsigned dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp4(unsigned dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// two fp32 -> bf16x2 (round to nearest even), x0 in the low half
__device__ __forceinline__ unsigned bf2(float x0, float x1) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x1), "f"(x0));
  return r;
}
// a copy the compiler cannot see through: keeps smem addresses from being hoisted out of the chunk
// loop (they are loop invariant, and ~100 hoisted address registers spilled)
__device__ __forceinline__ unsigned opaque(unsigned x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}
// ---- ptx helpers end ----

constexpr unsigned FULL = 0xffffffffu;
constexpr float LOG2E = 1.4426950408889634f;

// byte offset of 16-byte chunk ch of row r in a row-major tile of CPR chunks per row, XOR swizzled so
// that the 8 row addresses of one ldmatrix matrix fall in 8 different bank groups
template <int CPR>
__device__ __forceinline__ int swz(int r, int ch) {
  if constexpr (CPR >= 8) {
    return (r * CPR + (ch ^ (r & 7))) << 4;
  } else {
    static_assert(CPR == 4, "rows of 64 or >= 128 bytes");
    return (r * CPR + (ch ^ ((r >> 1) & 3))) << 4;
  }
}
// bf16 element (i, j) of a swizzled 64 x 64 tile
__device__ __forceinline__ int off64(int i, int j) { return swz<8>(i, j >> 3) + ((j & 7) << 1); }

// ldmatrix.x4 lane offsets. For a 16-row block at row0 (a multiple of 8) and chunk pair ch0 (even),
// the address is base + off[(ch0 >> 1) & 3] + row0 * row_bytes + (ch0 & 8) * 16, so the swizzle XOR
// is folded into four per-lane registers and everything else is an immediate.
// "A order": matrices (rows 0-7, ch0), (rows 8-15, ch0), (rows 0-7, ch0+1), (rows 8-15, ch0+1) -> an A
// fragment, or with .trans the B fragments (b0, b1) of two n tiles whose k runs along the rows.
// "B order": (rows 0-7, ch0), (rows 0-7, ch0+1), (rows 8-15, ch0), (rows 8-15, ch0+1) -> B fragments
// (b0, b1) of the two 8-row n tiles (k along the row); .x2 uses the first two (lanes 0-15).
template <int CPR>
__device__ __forceinline__ int lane_off(int lane, bool a_order, int q) {
  const int mi = lane >> 3, r8 = lane & 7;
  const int row = r8 + ((a_order ? (mi & 1) : (mi >> 1)) << 3);
  const int ch = 2 * q + (a_order ? (mi >> 1) : (mi & 1));
  return row * CPR * 16 + ((ch ^ (CPR >= 8 ? r8 : (row >> 1) & 3)) << 4);
}

__device__ __forceinline__ void split2(float x0, float x1, unsigned& hi, unsigned& lo) {
  hi = bf2(x0, x1);
  lo = bf2(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xffff0000u));
}
// accumulator tiles t0 (k 0-7) and t1 (k 8-15) of one 16-row block -> A fragment, hi and lo parts
__device__ __forceinline__ void frag_a(const float* t0, const float* t1, unsigned* hi, unsigned* lo) {
  split2(t0[0], t0[1], hi[0], lo[0]);
  split2(t0[2], t0[3], hi[1], lo[1]);
  split2(t1[0], t1[1], hi[2], lo[2]);
  split2(t1[2], t1[3], hi[3], lo[3]);
}
// 3-term product of split operands: c += ah*bh + al*bh + ah*bl (the al*bl term is below 2^-16)
__device__ __forceinline__ void mma3(float* c, const unsigned* ah, const unsigned* al, unsigned bh0, unsigned bh1,
                                     unsigned bl0, unsigned bl1) {
  mma(c, ah, bh0, bh1);
  mma(c, al, bh0, bh1);
  mma(c, ah, bl0, bl1);
}


enum { CF_RK, CF_RQ, CF_G2, CF_CX, CF_CO, CF_CU, NCF };

// shared memory layout in bytes (mirrored by chunk.py: BYTES = 72256 + 128 * DVB)
template <int DVB>
struct Smem {
  static constexpr int K = 0, Q = 16384, V = 32768;  // bf16 [64][128], [64][128], [64][DVB]
  static constexpr int MH = V + 64 * DVB * 2;        // bf16 [64][64]: -A below the diagonal blocks,
  static constexpr int ML = MH + 8192;               //   T_jj = (I + A_jj)^-1 on them; hi and lo
  static constexpr int AH = ML + 8192;               // bf16 [64][64]: Qn Kn^T ⊙ Γ, lower, hi and lo
  static constexpr int AL = AH + 8192;
  static constexpr int AD_STRIDE = 16 * 16 + 4;      // floats per diagonal block (+4: bank offset)
  static constexpr int AD = AL + 8192;               // fp32 [4][AD_STRIDE]: diagonal blocks of A
  static constexpr int CF = AD + 4 * AD_STRIDE * 4;  // fp32 [NCF][64] per-token coefficients
  static constexpr int RAW = CF + NCF * 256;         // fp32 [2 parity][g 64, beta 64]
  static constexpr int BYTES = RAW + 4 * 256;
};

// One chunk's dk-side operands on the split path: cuda/gdn/chunk_prep.cu writes one entry per (chunk,
// value head), cuda/gdn/chunk_state.cu copies it into shared memory as it is. Four swizzled (off64)
// 64 x 64 bf16 tiles: T = (I + A)^-1 hi and lo (lower blocks only are meaningful), Qn Kn^T ⊙ Γ ⊙ lower
// (scaled by q_scale / |q|) hi and lo; then fp32 rows of 64: beta, c_x, c_o, c_u and G2 (log2 cumsum).
// Mirrored by ENTRY_BYTES in engine/ops/gdn/chunk_split.py.
struct Entry {
  static constexpr int TH = 0, TL = 8192, AH = 16384, AL = 24576, CF = 32768;
  enum { BETA, CX, CO, CU, G2, NROW };
  static constexpr int BYTES = CF + NROW * 256;
};

// Entries of sequence b start at chunk index sum_{b' < b} ceil(len_b' / 64) (every CTA recomputes it
// from query_start_loc: B is at most a few hundred, so the loop costs less than one tile load).
__device__ __forceinline__ int chunk_offset(const int* qsl, int b) {
  int acc = 0;
  for (int i = 0; i < b; ++i) acc += (qsl[i + 1] - qsl[i] + 63) >> 6;
  return acc;
}

// ---- per-chunk phases shared by chunk.cu and chunk_prep.cu (inlined)

// 1/|row| + eps of the 64 K rows and 64 Q rows of the swizzled [64][128] tiles at sm + k_tile / q_tile,
// into rows rk_row / rq_row of the fp32 [.][64] coefficients cf: 4 lanes per row, NW warps taking 8
// rows at a time.
template <int NW>
__device__ __forceinline__ void inv_norms(const unsigned char* sm, int k_tile, int q_tile, float* cf, int rk_row,
                                          int rq_row, int w, int gq, int tq) {
  for (int base = 8 * w; base < 128; base += 8 * NW) {
    const int rr = base + gq, r = rr & 63;
    const unsigned char* tile = sm + (rr >= 64 ? q_tile : k_tile);
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float f[8];
      unpack8(*reinterpret_cast<const uint4*>(tile + swz<16>(r, 4 * tq + u)), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = fmaf(f[e], f[e], ss);
    }
    ss += __shfl_xor_sync(FULL, ss, 1);
    ss += __shfl_xor_sync(FULL, ss, 2);
    if (tq == 0) cf[(rr >= 64 ? rq_row : rk_row) * 64 + r] = rsqrtf(ss + 1e-6f);
  }
}

// One warp: g2[i] = log2(e) * (g[0] + ... + g[i]) for the chunk's 64 tokens (pair sums, then a warp
// scan; g2 may be g itself: every lane reads its pair before any lane writes).
__device__ __forceinline__ void cumsum_log2(const float* g, float* g2, int lane) {
  const float g0 = g[2 * lane], g1 = g[2 * lane + 1];
  float s = g0 + g1;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(FULL, s, o);
    if (lane >= o) s += y;
  }
  float ex = __shfl_up_sync(FULL, s, 1);
  if (lane == 0) ex = 0.f;
  g2[2 * lane] = (ex + g0) * LOG2E;
  g2[2 * lane + 1] = (ex + g0 + g1) * LOG2E;
}

// Column col of (I + L)^-1 for a strictly lower 16x16 block L (row stride ld floats, rows 16-byte
// aligned), by forward substitution in fp32: x[i] for i < col is 0, x[col] 1.
template <int LD>
__device__ __forceinline__ void diag_inverse_column(const float* lb, int col, float (&x)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) x[i] = i == col ? 1.f : 0.f;
#pragma unroll
  for (int i = 1; i < 16; ++i) {
    float acc = 0.f;
#pragma unroll
    for (int m4 = 0; m4 < i; m4 += 4) {
      const float4 l4 = *reinterpret_cast<const float4*>(lb + i * LD + m4);
      const float lv[4] = {l4.x, l4.y, l4.z, l4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (m4 + e < i) acc = fmaf(lv[e], x[m4 + e], acc);
    }
    if (i > col) x[i] = -acc;
  }
}

// ---- state-side phases shared by chunk.cu and the split path's state passes (inlined). A warp's state
// slab P holds 16 dv rows x (16 NKK) dk columns; ob16(i) / oa16(i) are this lane's ldmatrix offsets of
// dk chunk pair i within a [64][128] swizzled tile (B order / A order).

// O1 += P Q^T over the warp's NKK 16-wide dk steps (all 64 tokens along n), hi parts of P, plus the lo
// parts with LO.
template <int NKK, bool LO, typename OB16>
__device__ __forceinline__ void p_qt(float (*O)[4], const float (*P)[4], unsigned q, OB16 ob16) {
  unsigned ah[4], al[4], bf[4];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) O[nt][0] = O[nt][1] = O[nt][2] = O[nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < NKK; ++kk) {
    frag_a(P[2 * kk], P[2 * kk + 1], ah, al);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      ldsm4(q + ob16(kk & 3) + (kk & 4) * 32 + p * 4096, bf);
      mma(O[2 * p], ah, bf[0], bf[1]);
      mma(O[2 * p + 1], ah, bf[2], bf[3]);
      if constexpr (LO) {
        mma(O[2 * p], al, bf[0], bf[1]);
        mma(O[2 * p + 1], al, bf[2], bf[3]);
      }
    }
  }
}

// X = P K^T over the warp's NKK dk steps, P split hi + lo.
template <int NKK, typename OB16>
__device__ __forceinline__ void p_kt(float (*X)[4], const float (*P)[4], unsigned k, OB16 ob16) {
  unsigned ah[4], al[4], bf[4];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) X[nt][0] = X[nt][1] = X[nt][2] = X[nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < NKK; ++kk) {
    frag_a(P[2 * kk], P[2 * kk + 1], ah, al);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      ldsm4(k + ob16(kk & 3) + (kk & 4) * 32 + p * 4096, bf);
      mma(X[2 * p], ah, bf[0], bf[1]);
      mma(X[2 * p], al, bf[0], bf[1]);
      mma(X[2 * p + 1], ah, bf[2], bf[3]);
      mma(X[2 * p + 1], al, bf[2], bf[3]);
    }
  }
}

// R^T = V^T diag(beta) - X diag(c_x), in place over X (16 dv rows x 64 tokens); v: this warp's V^T
// fragments (ldmatrix.trans base), braw / cx: the chunk's beta and c_x rows.
template <int VCPR>
__device__ __forceinline__ void r_from_x(float (*X)[4], unsigned v, const float* braw, const float* cx, int tq) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    unsigned vv[4];
    ldsm4t(v + p * 16 * VCPR * 16, vv);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float* x = X[2 * p + hh];
      const int j = 16 * p + 8 * hh + 2 * tq;
      const float b0 = braw[j], b1 = braw[j + 1], c0 = cx[j], c1 = cx[j + 1];
      x[0] = b0 * lo_bf16(vv[2 * hh]) - c0 * x[0];
      x[1] = b1 * hi_bf16(vv[2 * hh]) - c1 * x[1];
      x[2] = b0 * lo_bf16(vv[2 * hh + 1]) - c0 * x[2];
      x[3] = b1 * hi_bf16(vv[2 * hh + 1]) - c1 * x[3];
    }
  }
}

// P <- egl P + (Vn diag(c_u)) K over the warp's NKK dk steps (K rows are tokens: B fragments via
// .trans; cu: the chunk's c_u row).
template <int NKK, typename OA16>
__device__ __forceinline__ void state_update(float (*P)[4], const float (*Vn)[4], unsigned k, float egl, const float* cu_row,
                                             int tq, OA16 oa16) {
  unsigned ah[4], al[4], bf[4];
#pragma unroll
  for (int nt = 0; nt < 2 * NKK; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) P[nt][e] *= egl;
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    const float* cu = cu_row + 16 * kb + 2 * tq;
    const float u0[4] = {Vn[2 * kb][0] * cu[0], Vn[2 * kb][1] * cu[1], Vn[2 * kb][2] * cu[0], Vn[2 * kb][3] * cu[1]};
    const float u1[4] = {Vn[2 * kb + 1][0] * cu[8], Vn[2 * kb + 1][1] * cu[9], Vn[2 * kb + 1][2] * cu[8],
                         Vn[2 * kb + 1][3] * cu[9]};
    frag_a(u0, u1, ah, al);
#pragma unroll
    for (int c2 = 0; c2 < NKK; ++c2) {
      ldsm4t(k + oa16(c2 & 3) + (c2 & 4) * 32 + kb * 4096, bf);
      mma(P[2 * c2], ah, bf[0], bf[1]);
      mma(P[2 * c2], al, bf[0], bf[1]);
      mma(P[2 * c2 + 1], ah, bf[2], bf[3]);
      mma(P[2 * c2 + 1], al, bf[2], bf[3]);
    }
  }
}

// ---- a self-contained kernel phase (called once per chunk; inlined)

// T_jj = (I + A_jj)^-1 of the four 16x16 diagonal blocks of A (fp32 in ad), by forward substitution
// in fp32: warps 0-1, one lane per column of one block; stored split into bf16 hi and lo at MH / ML.
template <int AD_STRIDE, int MH, int ML>
__device__ __forceinline__ void invert_diag_blocks(unsigned char* sm, const float* ad, int w, int lane) {
  const int bj = 2 * w + (lane >> 4), col = lane & 15;
  float x[16];
  diag_inverse_column<16>(ad + bj * AD_STRIDE, col, x);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const unsigned hl = bf2(x[i], 0.f);
    const unsigned ll = bf2(x[i] - __uint_as_float(hl << 16), 0.f);
    *reinterpret_cast<unsigned short*>(sm + MH + off64(16 * bj + i, 16 * bj + col)) = (unsigned short)hl;
    *reinterpret_cast<unsigned short*>(sm + ML + off64(16 * bj + i, 16 * bj + col)) = (unsigned short)ll;
  }
}

// The chunk's output O^T (this warp's 16 dv rows x 64 tokens, mma accumulator layout) as bf16: lanes
// gq and gq ^ 1 swap halves so that each stores two adjacent dv columns of one token; tokens >= n
// (past the sequence end) are not stored. out [T, nv, 128]; t0 the chunk's first token, dv0 the warp's
// first dv column of value head h.
// One 16-dv x 8-token accumulator tile o (tokens 8 nt .. 8 nt + 7 of the chunk), as store_out_rows.
__device__ __forceinline__ void store_out_tile(const float* o, int nt, bf16_t* out, int t0, int n, int nv, int h,
                                               int dv0, int lane) {
  const int gq = lane >> 2, tq = lane & 3;
  const bool odd = gq & 1;
  const float r0 = __shfl_xor_sync(FULL, odd ? o[0] : o[1], 4);
  const float r1 = __shfl_xor_sync(FULL, odd ? o[2] : o[3], 4);
  const unsigned w0 = odd ? bf2(r0, o[1]) : bf2(o[0], r0);
  const unsigned w1 = odd ? bf2(r1, o[3]) : bf2(o[2], r1);
  const int tok = 8 * nt + 2 * tq + (odd ? 1 : 0);
  if (tok < n) {
    bf16_t* op = out + ((size_t)(t0 + tok) * nv + h) * 128 + dv0 + gq - (odd ? 1 : 0);
    *reinterpret_cast<unsigned*>(op) = w0;
    *reinterpret_cast<unsigned*>(op + 8) = w1;
  }
}
__device__ __forceinline__ void store_out_rows(const float (*O)[4], bf16_t* out, int t0, int n, int nv, int h, int dv0,
                                               int lane) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) store_out_tile(O[nt], nt, out, t0, n, nv, h, dv0, lane);
}

}  // namespace gdnc

// Optional phase timestamps (compile with -DGDN_CHUNK_PROFILE; engine/bench/chunk.py --profile):
// clock64 at 14 marks per chunk, lane 0 of every warp, first 64 CTAs and 32 chunks.
#ifdef GDN_CHUNK_PROFILE
__device__ long long gdnc_prof[64 * 32 * 8 * 16];
#define GDNC_MARK(m)                                                                              \
  do {                                                                                            \
    const int cta_ = blockIdx.y * gridDim.x + blockIdx.x;                                         \
    if (lane == 0 && cta_ < 64 && c < 32) gdnc_prof[((cta_ * 32 + c) * 8 + w) * 16 + (m)] = clock64(); \
  } while (0)
#else
#define GDNC_MARK(m)
#endif

