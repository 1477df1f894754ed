// Skinny GEMM for decode: y[M, N] = x[M, K] @ W[N, K]^T (F.linear), M <= 8, bf16 in memory, fp32
// accumulation on tensor cores. At M <= 8 the op reads N*K*2 bytes of weights and does 2*M*N*K flops:
// it is DRAM bound, so the kernel is built around the weight stream and the math only has to keep up.
//
// One mma.sync m16n8k16 per 16 weight rows x 16 k: W is the A operand (16 x 16, rows = output
// columns n), x the B operand (16 x 8, its 8 columns = the M rows, unused ones zero), C = y^T tile in
// fp32. A dot product does not care in which order k is visited, so the fragments' k order is
// permuted to fit plain loads: lane (g = lane / 4, t = lane % 4) loads the 16 bytes at k = kb + 8t of
// W rows g and g + 8 and of x row g, and uses words .x, .y as the fragment of k-step kb and .z, .w as
// that of k-step kb + 16 (the same permutation on both operands, so every product pairs the right
// elements). Each warp load reads 64 contiguous bytes of 8 rows; UNROLL of them cover 64 * UNROLL
// bytes of each row, and all loads of an iteration are issued before its first mma.
//
// CTA: WARPS warps on the same 16 * TILES rows, splitting K (warp w takes k-chunks w, w + WARPS, ...
// of 32 * UNROLL), so a narrow N (2560) still puts enough loads in flight; the warps' fp32 tiles are
// summed through shared memory in warp order, so the result is bitwise the same on every run (no
// atomics, no split-K launch). Rows past N read row N - 1 (always valid) and are never stored; k
// past K (only when K is not a multiple of 32 * UNROLL; per lane, so each 16-byte load is either
// wholly inside a row or not issued) is zero in both operands; x rows g >= m are zero and never read.
// Grid: ceil(N / (16 * TILES)), block: 32 * WARPS.
// Layouts: x [m, K] and W [N, K] contiguous bf16, 16-byte aligned, K % 8 == 0; y [m, N] contiguous.
// PDL (cuda/common/pdl.cuh): each warp issues its first iteration's weight loads before the wait, so
// under a programmatic launch they are in flight while the kernel before finishes (weights are never
// written by a step); x is read only after the wait. Without PDL the instruction stream is the same.
// No CUDA headers: NVRTC through CuPy and nvcc see the same text.
#include "common/pdl.cuh"
typedef unsigned short bf16_t;

// Tuning rows (engine/ops/gemm/cuda.py parses them): SM, warps per CTA, iterations per warp the
// unroll of a narrow N aims at. The wrapper always takes one 16-row tile per CTA; a wide N (at least
// 2 CTAs per SM) takes UNROLL 1, a narrow N (the 2560-row projections: 160 CTAs) the smallest UNROLL
// (1, 2, 4) that leaves each warp at most ITERS iterations of K, so enough loads are in flight.
// From the H200 sweep of (TILES, WARPS, UNROLL) (docs/bench-evidence/2026-12-01-skinny-gemm.md), us at
// M = 1 / 8, the first table's (2, 8, 2) or (1, 8, 4) -> this one: in_proj 19.2 / 20.9 -> 18.7 / 19.6;
// gate_up 29.1 / 34.5 -> 25.8 / > 27.6; lm_head 395 / 325 -> 287 / 290; down (K 9216) 16.9 / 17.0 ->
// 15.4 / 16.0; out_proj (K 4096) 9.3 / 9.4 -> 8.7 / 9.0. At M = 8, 8 warps beat 16 on in_proj, qkv and
// gate_up by 3-8%; two 16-row tiles per CTA (x read once per 32 rows) never beat one by more than noise.
#define SKINNY_TABLE(X) \
  X(80, 16, 4)          \
  X(90, 16, 4)          \
  X(120, 16, 4)

template <int SM>
struct SkinnyParams;
#define SKINNY_ROW(SM, WARPS, ITERS)         \
  template <>                                \
  struct SkinnyParams<SM> {                  \
    static constexpr int warps = WARPS;      \
    static constexpr int iters = ITERS;      \
  };
SKINNY_TABLE(SKINNY_ROW)
#undef SKINNY_ROW

// weights are read once per launch: skip L1, and ask L2 for the whole 256-byte neighbourhood (the
// next chunk of the row belongs to the next warp)
__device__ __forceinline__ uint4 sk_load_stream(const bf16_t* p) {
  uint4 r;
  // volatile: kept in program order with the PDL wait, so the first iteration's loads stay before it
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// x: a plain load (a few KB that every CTA re-reads; the caches serve it)
__device__ __forceinline__ uint4 sk_load_x(const bf16_t* p) { return *reinterpret_cast<const uint4*>(p); }

// c += A * B for one 16 x 8 fp32 tile; a0..a3 the A fragment words, b0, b1 the B fragment words
__device__ __forceinline__ void sk_mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                       unsigned b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ bf16_t sk_to_bf16(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}

// One iteration of a warp: UNROLL groups of 32 k from k0, every load first, then 2 mma per group and
// tile. CHECK masks this lane's loads past K (the last iteration of a K that is not a multiple of the
// chunk): the lane's 8 values start at k0 + 32u + kt (wrow and xrow already include kt = 8t).
template <int TILES, int UNROLL>
struct SkIter {
  uint4 a[TILES][2][UNROLL];  // W fragments
  uint4 b[UNROLL];            // x fragments
};

template <int TILES, int UNROLL, bool CHECK>
__device__ __forceinline__ void sk_load_w(SkIter<TILES, UNROLL>& it, const bf16_t* const (&wrow)[TILES][2], int k0,
                                          int kt, int K) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int k = k0 + 32 * u;
    const bool in = !CHECK || k + kt < K;
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        it.a[i][h][u] = make_uint4(0u, 0u, 0u, 0u);
        if (in) it.a[i][h][u] = sk_load_stream(wrow[i][h] + k);
      }
    }
  }
}

template <int TILES, int UNROLL, bool CHECK>
__device__ __forceinline__ void sk_load_x(SkIter<TILES, UNROLL>& it, const bf16_t* xrow, bool has_x, int k0, int kt,
                                          int K) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int k = k0 + 32 * u;
    it.b[u] = make_uint4(0u, 0u, 0u, 0u);
    if (has_x && (!CHECK || k + kt < K)) it.b[u] = sk_load_x(xrow + k);
  }
}

template <int TILES, int UNROLL>
__device__ __forceinline__ void sk_mma_iter(const SkIter<TILES, UNROLL>& it, float (&acc)[TILES][4]) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
      sk_mma(acc[i], it.a[i][0][u].x, it.a[i][1][u].x, it.a[i][0][u].y, it.a[i][1][u].y, it.b[u].x, it.b[u].y);
      sk_mma(acc[i], it.a[i][0][u].z, it.a[i][1][u].z, it.a[i][0][u].w, it.a[i][1][u].w, it.b[u].z, it.b[u].w);
    }
  }
}

template <int TILES, int UNROLL, bool CHECK>
__device__ __forceinline__ void sk_step(const bf16_t* const (&wrow)[TILES][2], const bf16_t* xrow, bool has_x,
                                        int k0, int kt, int K, float (&acc)[TILES][4]) {
  SkIter<TILES, UNROLL> it;
  sk_load_w<TILES, UNROLL, CHECK>(it, wrow, k0, kt, K);
  sk_load_x<TILES, UNROLL, CHECK>(it, xrow, has_x, k0, kt, K);
  sk_mma_iter(it, acc);
}

// MT: the row count the kernel is built for (1, 2, 4, 8); m <= MT rows are live at run time.
template <int MT, int TILES, int WARPS, int UNROLL>
__global__ void __launch_bounds__(32 * WARPS)
    skinny_gemm_kernel(const bf16_t* x, const bf16_t* __restrict__ w, bf16_t* __restrict__ y, int m,
                       int N, int K) {
  static_assert(MT == 1 || MT == 2 || MT == 4 || MT == 8, "row counts 1, 2, 4, 8");
  constexpr int ROWS = 16 * TILES;
  constexpr int CHUNK = 32 * UNROLL;
  __shared__ float red[WARPS][MT][ROWS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * ROWS;

  const bf16_t* wrow[TILES][2];
#pragma unroll
  for (int i = 0; i < TILES; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = min(row0 + 16 * i + 8 * h + g, N - 1);
      wrow[i][h] = w + (size_t)r * K + 8 * t;
    }
  }
  const bool has_x = g < MT && g < m;
  const bf16_t* xrow = x + (size_t)(has_x ? g : 0) * K + 8 * t;

  float acc[TILES][4];
#pragma unroll
  for (int i = 0; i < TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  const int kt = 8 * t;
  int k0 = warp * CHUNK;
  // the first full iteration's weights before the PDL wait, its x after; same k order as the loop
  const bool first = k0 + CHUNK <= K;
  SkIter<TILES, UNROLL> it0;
  if (first) sk_load_w<TILES, UNROLL, false>(it0, wrow, k0, kt, K);
  DS_PDL_BEGIN();
  if (first) {
    sk_load_x<TILES, UNROLL, false>(it0, xrow, has_x, k0, kt, K);
    sk_mma_iter(it0, acc);
    k0 += WARPS * CHUNK;
  }
  for (; k0 + CHUNK <= K; k0 += WARPS * CHUNK) sk_step<TILES, UNROLL, false>(wrow, xrow, has_x, k0, kt, K, acc);
  if (k0 < K) sk_step<TILES, UNROLL, true>(wrow, xrow, has_x, k0, kt, K, acc);

  // C fragment: acc[i] = (n g, m 2t), (n g, m 2t+1), (n g+8, m 2t), (n g+8, m 2t+1) of tile i
#pragma unroll
  for (int i = 0; i < TILES; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int mm = 2 * t + (e & 1);
      if (mm < MT) red[warp][mm][16 * i + g + 8 * (e >> 1)] = acc[i][e];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < MT * ROWS; idx += 32 * WARPS) {
    const int mm = idx / ROWS, j = idx % ROWS;
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < WARPS; ++v) s += red[v][mm][j];
    const int n = row0 + j;
    if (mm < m && n < N) y[(size_t)mm * N + n] = sk_to_bf16(s);
  }
}

#ifdef DELTASERVE_NVCC_CHECK
// what the wrapper launches on this architecture: every row count, one tile, UNROLL 1, 2, 4
#define SK_INST(MT, UNROLL)                                                                           \
  template __global__ void skinny_gemm_kernel<MT, 1, SkinnyParams<DS_SM>::warps, UNROLL>(              \
      const bf16_t*, const bf16_t*, bf16_t*, int, int, int);
#define SK_INST_ROWS(MT) SK_INST(MT, 1) SK_INST(MT, 2) SK_INST(MT, 4)
SK_INST_ROWS(1)
SK_INST_ROWS(2)
SK_INST_ROWS(4)
SK_INST_ROWS(8)
#undef SK_INST_ROWS
#undef SK_INST
#endif
