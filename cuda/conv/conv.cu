// K1 (conv part): causal depthwise conv1d + SiLU over the GDN q|k|v channels, varlen prefill and
// single-token decode, with the K-1 column conv state pool updated in place.
//
// Numerics follow HF/engine.ops.conv.reference: products accumulate in fp32 (cuDNN's bf16 conv does
// too), the conv output is rounded to bf16, SiLU runs in fp32 on that bf16 value and is rounded again.
//
// Layouts: x [T, C] bf16 (row stride x_stride, channels contiguous), weight [C, K] bf16 contiguous,
// conv_state [S, C, K-1] bf16 contiguous, out [T, C] bf16 contiguous, query_start_loc [B+1] int32,
// state_slot [B] int32 (slot <= 0: padding, its state is neither read nor written), has_init [B] u8.
// Each thread owns VEC consecutive channels (8, or 4 with conv.vec4) so every activation load/store
// is one vector; the state-update and decode kernels always take 8 (CONV_VEC).
#include "common/arch_params.cuh"

#define CONV_VEC 8
#define CONV_KMAX 8  // widest conv the generic (non-k4) path accepts

// VEC channels per thread: 8 (one 16-byte vector per row) or 4 (8 bytes; arm conv.vec4: about half
// the registers, so twice the resident warps to hide DRAM latency).
template <int VEC> struct ConvVec;
template <> struct ConvVec<8> { typedef uint4 T; };
template <> struct ConvVec<4> { typedef uint2 T; };
__device__ __forceinline__ void unpackv(const uint4& u, float* f) { unpack8(u, f); }
__device__ __forceinline__ void unpackv(const uint2& u, float* f) {
  f[0] = lo_bf16(u.x); f[1] = hi_bf16(u.x); f[2] = lo_bf16(u.y); f[3] = hi_bf16(u.y);
}
__device__ __forceinline__ void packv(const float* f, uint4& u) { u = pack8(f); }
__device__ __forceinline__ void packv(const float* f, uint2& u) {
  u = make_uint2(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]));
}
__device__ __forceinline__ void zerov(uint4& u) { u = make_uint4(0u, 0u, 0u, 0u); }
__device__ __forceinline__ void zerov(uint2& u) { u = make_uint2(0u, 0u); }

// KT > 0: width fixed at compile time (arm conv.k4, all taps unrolled without predicates);
// KT == 0: runtime width kw <= CONV_KMAX, taps predicated.
// TOK: tokens per thread; the K-1 previous inputs slide through registers, so one thread reads each
// input once (TOK = 8 is arm conv.chunk8, 1 is the plain per-token grid).
// grid: (ceil(C / (VEC * THREADS)), ceil(max_query_len / TOK), B)
// Min blocks per SM: ptxas' own choice (0) except for the k4 instantiations, where it picked 96
// registers and spilled on sm_120; 2 gives them room without a spill on sm_90 and sm_120.
template <int KT, int TOK, int THREADS, int VEC>
__global__ void __launch_bounds__(THREADS, KT == 4 && VEC == 8 ? 2 : 0)
    conv_prefill_kernel(const bf16_t* __restrict__ x, int x_stride, const bf16_t* __restrict__ weight,
                        const bf16_t* __restrict__ conv_state, const int* __restrict__ qsl,
                        const int* __restrict__ slots, const unsigned char* __restrict__ has_init,
                        bf16_t* __restrict__ out, int C, int kw) {
  constexpr int KM = KT > 0 ? KT : CONV_KMAX;
  const int K = KT > 0 ? KT : kw;
  const int b = blockIdx.z;
  const int c0 = (blockIdx.x * THREADS + threadIdx.x) * VEC;
  const int start = qsl[b];
  const int len = qsl[b + 1] - start;
  const int t0 = blockIdx.y * TOK;
  if (c0 >= C || t0 >= len) return;
  const int slot = slots[b];
  const bool hist = slot > 0 && has_init[b] != 0;

  // taps right-aligned: w[m] multiplies input t-(KM-1)+m; the first KM-K taps are zero (generic path)
  float w[KM][VEC];
  if constexpr (KT == 4) {
    // VEC channels x 4 taps are 8 * VEC contiguous bytes: 16-byte loads instead of 4 * VEC scalar ones
    const uint4* wp = reinterpret_cast<const uint4*>(weight + (size_t)c0 * 4);
#pragma unroll
    for (int u = 0; u < VEC / 2; ++u) {
      float f[8];
      unpack8(wp[u], f);
#pragma unroll
      for (int q = 0; q < 8; ++q) w[q % 4][2 * u + q / 4] = f[q];
    }
  } else {
#pragma unroll
    for (int m = 0; m < KM; ++m) {
      const int j = m - (KM - K);
#pragma unroll
      for (int e = 0; e < VEC; ++e) w[m][e] = (j >= 0) ? bf16_to_f(weight[(size_t)(c0 + e) * K + j]) : 0.f;
    }
  }

  // the previous inputs, right-aligned: h[m] is input t0-(KM-1)+m, so h[KM-2] is t0-1
  float h[KM - 1][VEC];
#pragma unroll
  for (int m = 0; m < KM - 1; ++m) {
    const int p = t0 - (KM - 1) + m;  // input position relative to the sequence start
#pragma unroll
    for (int e = 0; e < VEC; ++e) h[m][e] = 0.f;
    if (m < KM - K) continue;  // taps beyond the runtime width
    if (p >= 0) {
      float f[VEC];
      unpackv(*reinterpret_cast<const typename ConvVec<VEC>::T*>(x + (size_t)(start + p) * x_stride + c0), f);
#pragma unroll
      for (int e = 0; e < VEC; ++e) h[m][e] = f[e];
    } else if (hist) {
      const bf16_t* st = conv_state + ((size_t)slot * C + c0) * (K - 1);
#pragma unroll
      for (int e = 0; e < VEC; ++e) h[m][e] = bf16_to_f(st[e * (K - 1) + (K - 1) + p]);
    }
  }

  // all TOK rows are loaded before any math so their loads are in flight together (a data-dependent
  // break in the loop would serialise them); rows past the sequence end are predicated off
  typedef typename ConvVec<VEC>::T vec_t;
  vec_t raw[TOK];
#pragma unroll
  for (int s = 0; s < TOK; ++s) {
    if (t0 + s < len)
      raw[s] = *reinterpret_cast<const vec_t*>(x + (size_t)(start + t0 + s) * x_stride + c0);
    else
      zerov(raw[s]);
  }
#pragma unroll
  for (int s = 0; s < TOK; ++s) {
    const int t = t0 + s;
    float cur[VEC];
    unpackv(raw[s], cur);
    float acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      acc[e] = 0.f;
#pragma unroll
      for (int m = 0; m < KM - 1; ++m) acc[e] = fmaf(w[m][e], h[m][e], acc[e]);
      acc[e] = fmaf(w[KM - 1][e], cur[e], acc[e]);
    }
    // The conv output is rounded to bf16 two channels per conversion, SiLU runs on it in fp32, and
    // packv rounds the SiLU output: the same bits as rounding each value on its own (twice), with a
    // quarter of the conversions; ~10% faster on the H200 (docs/bench-evidence/2026-12-02-s30.md).
    float o[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e += 2) {
      const unsigned int r = pack_bf16x2(acc[e], acc[e + 1]);
      o[e] = silu_f(lo_bf16(r));
      o[e + 1] = silu_f(hi_bf16(r));
    }
    if (t < len) packv(o, *reinterpret_cast<vec_t*>(out + (size_t)(start + t) * C + c0));
#pragma unroll
    for (int m = 0; m < KM - 2; ++m)
#pragma unroll
      for (int e = 0; e < VEC; ++e) h[m][e] = h[m + 1][e];
#pragma unroll
    for (int e = 0; e < VEC; ++e) h[KM - 2][e] = cur[e];
  }
}

// New conv state after a prefill: the last K-1 inputs of each sequence, reaching into the old state
// when the sequence is shorter than K-1. A separate launch because the conv CTAs of the first chunk
// still read the old state; the stream orders this after them. Each thread reads all its old values
// before writing, so the in-place update is race free. grid: (ceil(C / (8 * THREADS)), B)
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
    conv_state_update_kernel(const bf16_t* __restrict__ x, int x_stride, bf16_t* __restrict__ conv_state,
                             const int* __restrict__ qsl, const int* __restrict__ slots,
                             const unsigned char* __restrict__ has_init, int C, int kw) {
  const int b = blockIdx.y;
  const int c0 = (blockIdx.x * THREADS + threadIdx.x) * CONV_VEC;
  const int slot = slots[b];
  if (c0 >= C || slot <= 0) return;
  const int start = qsl[b];
  const int len = qsl[b + 1] - start;
  const bool hist = has_init[b] != 0;
  const int H = kw - 1;
  bf16_t* st = conv_state + ((size_t)slot * C + c0) * H;
  bf16_t nv[CONV_KMAX - 1][CONV_VEC];
#pragma unroll
  for (int i = 0; i < CONV_KMAX - 1; ++i) {
    if (i >= H) break;
    const int p = len - H + i;
    if (p >= 0) {
      const uint4 u = *reinterpret_cast<const uint4*>(x + (size_t)(start + p) * x_stride + c0);
      const unsigned int ws[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int e = 0; e < CONV_VEC; ++e) nv[i][e] = (bf16_t)(ws[e / 2] >> (16 * (e % 2)));
    } else {
#pragma unroll
      for (int e = 0; e < CONV_VEC; ++e) nv[i][e] = hist ? st[e * H + H + p] : (bf16_t)0;
    }
  }
#pragma unroll
  for (int i = 0; i < CONV_KMAX - 1; ++i) {
    if (i >= H) break;
#pragma unroll
    for (int e = 0; e < CONV_VEC; ++e) st[e * H + i] = nv[i][e];
  }
}

// Decode: one token per sequence. window = state ++ x; out = silu(conv); state <- window[1:].
// slot <= 0 (padding): zero history, state untouched. grid: (ceil(C / (8 * THREADS)), B)
template <int KT, int THREADS>
__global__ void __launch_bounds__(THREADS)
    conv_decode_kernel(const bf16_t* __restrict__ x, int x_stride, const bf16_t* __restrict__ weight,
                       bf16_t* __restrict__ conv_state, const int* __restrict__ slots,
                       bf16_t* __restrict__ out, int out_stride, int C, int kw) {
  constexpr int KM = KT > 0 ? KT : CONV_KMAX;
  const int K = KT > 0 ? KT : kw;
  const int b = blockIdx.y;
  const int c0 = (blockIdx.x * THREADS + threadIdx.x) * CONV_VEC;
  if (c0 >= C) return;
  const int slot = slots[b];
  float cur[CONV_VEC];
  unpack8(*reinterpret_cast<const uint4*>(x + (size_t)b * x_stride + c0), cur);
  bf16_t* st = conv_state + ((size_t)(slot > 0 ? slot : 0) * C + c0) * (K - 1);
  float o[CONV_VEC];
#pragma unroll
  for (int e = 0; e < CONV_VEC; ++e) {
    float win[KM];
#pragma unroll
    for (int j = 0; j < KM - 1; ++j) win[j] = (j < K - 1 && slot > 0) ? bf16_to_f(st[e * (K - 1) + j]) : 0.f;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < KM - 1; ++j)
      if (j < K - 1) acc = fmaf(bf16_to_f(weight[(size_t)(c0 + e) * K + j]), win[j], acc);
    acc = fmaf(bf16_to_f(weight[(size_t)(c0 + e) * K + K - 1]), cur[e], acc);
    o[e] = bf16_round(silu_f(bf16_round(acc)));
    if (slot > 0) {
#pragma unroll
      for (int j = 0; j < KM - 1; ++j)
        if (j < K - 1) st[e * (K - 1) + j] = (j + 1 < K - 1) ? f_to_bf16(win[j + 1]) : f_to_bf16(cur[e]);
    }
  }
  *reinterpret_cast<uint4*>(out + (size_t)b * out_stride + c0) = pack8(o);
}

#ifdef DELTASERVE_NVCC_CHECK
// CI compile check (tests/test_cuda_compile.py): emit the hot instantiations for ptxas -v.
#define P_ ArchParams<DS_SM>
template __global__ void conv_prefill_kernel<4, 8, P_::conv_threads, 8>(const bf16_t*, int, const bf16_t*, const bf16_t*, const int*, const int*, const unsigned char*, bf16_t*, int, int);
template __global__ void conv_prefill_kernel<4, 8, P_::conv_threads, 4>(const bf16_t*, int, const bf16_t*, const bf16_t*, const int*, const int*, const unsigned char*, bf16_t*, int, int);
template __global__ void conv_prefill_kernel<0, 8, P_::conv_threads, 4>(const bf16_t*, int, const bf16_t*, const bf16_t*, const int*, const int*, const unsigned char*, bf16_t*, int, int);
template __global__ void conv_prefill_kernel<0, 8, P_::conv_threads, 8>(const bf16_t*, int, const bf16_t*, const bf16_t*, const int*, const int*, const unsigned char*, bf16_t*, int, int);
template __global__ void conv_prefill_kernel<0, 1, P_::conv_threads, 8>(const bf16_t*, int, const bf16_t*, const bf16_t*, const int*, const int*, const unsigned char*, bf16_t*, int, int);
template __global__ void conv_state_update_kernel<P_::conv_threads>(const bf16_t*, int, bf16_t*, const int*, const int*, const unsigned char*, int, int);
template __global__ void conv_decode_kernel<4, P_::conv_threads>(const bf16_t*, int, const bf16_t*, bf16_t*, const int*, bf16_t*, int, int, int);
template __global__ void conv_decode_kernel<0, P_::conv_threads>(const bf16_t*, int, const bf16_t*, bf16_t*, const int*, bf16_t*, int, int, int);
#undef P_
#endif
