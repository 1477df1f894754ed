// Fused bf16 elementwise kernels around the GEMMs of a Qwen3.5 layer (issue 10, item 2): bf16 in
// memory, fp32 in registers, each rounding placed where the torch reference composition rounds.
//   add_rms_norm_kernel     h = bf16(residual + x); y = bf16(h * rsqrt(mean(h^2) + eps) * (1 + w))
//   silu_mul_kernel         out = bf16(silu(gate) * up) from one [N, 2I] projection, one rounding
//   qk_norm_rope_kv_kernel  q/k RMSNorm + partial neox RoPE; q to a contiguous [T, H, D], k and v
//                           straight into the paged cache
// Self-contained (no CUDA headers, no other cuda/ files): NVRTC through CuPy and nvcc see the same
// text. Pointers to bf16 are raw 16-bit words; every vector access is 16 bytes (8 values), which the
// wrapper (engine/ops/norm/fused_cuda.py) checks by alignment and stride before launching.
#include "common/pdl.cuh"
typedef unsigned short bf16_t;

__device__ __forceinline__ float fu_bf16_to_f(bf16_t h) { return __uint_as_float(((unsigned int)h) << 16); }

// round-to-nearest-even, what torch's .to(torch.bfloat16) and every bf16 tensor op do on finite values
__device__ __forceinline__ float fu_round(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return __uint_as_float(((unsigned int)r) << 16);
}

// a in the low half, b in the high half (the first PTX source operand fills the high half)
__device__ __forceinline__ unsigned int fu_pack2(float a, float b) {
  unsigned int r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
}

__device__ __forceinline__ void fu_unpack8(const uint4& u, float* f) {
  f[0] = __uint_as_float(u.x << 16); f[1] = __uint_as_float(u.x & 0xffff0000u);
  f[2] = __uint_as_float(u.y << 16); f[3] = __uint_as_float(u.y & 0xffff0000u);
  f[4] = __uint_as_float(u.z << 16); f[5] = __uint_as_float(u.z & 0xffff0000u);
  f[6] = __uint_as_float(u.w << 16); f[7] = __uint_as_float(u.w & 0xffff0000u);
}

__device__ __forceinline__ uint4 fu_pack8(const float* f) {
  return make_uint4(fu_pack2(f[0], f[1]), fu_pack2(f[2], f[3]), fu_pack2(f[4], f[5]), fu_pack2(f[6], f[7]));
}

// 8 consecutive weights from element c0 as fp32 (bf16 or fp32 storage; both 16-byte aligned here)
template <bool W_BF16>
__device__ __forceinline__ void fu_weight8(const void* w, int c0, float* f) {
  if (W_BF16) {
    fu_unpack8(*reinterpret_cast<const uint4*>(static_cast<const bf16_t*>(w) + c0), f);
  } else {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(w) + c0);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(w) + c0 + 4);
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
  }
}

// Sum over the TPR consecutive threads that own one row. TPR <= 32: xor shuffles stay inside the
// aligned lane group, and every lane of the warp takes part (no thread returns early, so the full mask
// is valid). TPR > 32: the CTA is one row; warp sums meet in shared memory, read once, so a single
// barrier suffices.
template <int TPR>
__device__ __forceinline__ float fu_row_sum(float v, float* red) {
  if constexpr (TPR <= 32) {
#pragma unroll
    for (int m = TPR / 2; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
  } else {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < TPR / 32; ++w) s += red[w];
    return s;
  }
}

// ---------------------------------------------------------------------------------------------------
// add_rms_norm: x, residual [N, D] bf16 with row strides; weight [D]; y, h [N, D] contiguous.
// SPLITS > 0: x is instead SPLITS fp32 partial products [SPLITS, N, D] of an explicit split-K GEMM
// (engine/ops/gemm/split_norm.py), row stride x_stride, one split N * x_stride values after the last;
// they are summed in split order and rounded once to bf16, which is the projection's output the
// bf16 path would read (cuBLAS sums its K in some order of its own and rounds once too).
// D = VPT * TPR * 8: thread j of a row owns the VPT 16-byte vectors j, j + TPR, ... (coalesced).
// ROWS rows per CTA (ROWS = 1 when TPR > 32). grid: ceil(N / ROWS), block: TPR * ROWS.
// Zero-centred RMSNorm in the reference order: (h * rsqrt(mean + eps)) * (1 + w) in fp32, then round.
// h may be res itself (the residual stream updated in place): each thread loads every vector it owns
// before it stores any, and only its own, so res and h carry no __restrict__.
template <int VPT, int TPR, int ROWS, bool HAS_RES, bool W_BF16, int SPLITS>
__global__ void __launch_bounds__(TPR * ROWS)
    add_rms_norm_kernel(const void* __restrict__ x, int x_stride, const bf16_t* res, int res_stride,
                        const void* __restrict__ weight, bf16_t* __restrict__ y, bf16_t* h, int h_stride, int N,
                        float eps) {
  DS_PDL_BEGIN();  // cuda/common/pdl.cuh: before any read of the previous kernels' outputs
  static_assert(TPR <= 32 ? (TPR & (TPR - 1)) == 0 : (TPR % 32 == 0 && ROWS == 1), "row group shape");
  constexpr int D = VPT * TPR * 8;
  __shared__ float red[TPR > 32 ? TPR / 32 : 1];
  const int row = blockIdx.x * ROWS + threadIdx.x / TPR;
  const int j = threadIdx.x % TPR;
  const bool valid = row < N;
  uint4 xr[VPT], rr[VPT];
  float v[VPT][8];
#pragma unroll
  for (int p = 0; p < VPT; ++p) {
    const int c0 = (p * TPR + j) * 8;
    xr[p] = rr[p] = make_uint4(0u, 0u, 0u, 0u);
    if (SPLITS == 0 && valid)
      xr[p] = *reinterpret_cast<const uint4*>(static_cast<const bf16_t*>(x) + (size_t)row * x_stride + c0);
    if (HAS_RES && valid) rr[p] = *reinterpret_cast<const uint4*>(res + (size_t)row * res_stride + c0);
    if constexpr (SPLITS > 0) {
      // every split's two float4 loads are issued before the first add
      float4 a[SPLITS][2];
      const float* xp = static_cast<const float*>(x) + (size_t)row * x_stride + c0;
      const size_t split_stride = (size_t)N * x_stride;
#pragma unroll
      for (int q = 0; q < SPLITS; ++q) {
        a[q][0] = a[q][1] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (valid) {
          a[q][0] = *reinterpret_cast<const float4*>(xp + q * split_stride);
          a[q][1] = *reinterpret_cast<const float4*>(xp + q * split_stride + 4);
        }
      }
      float t[8] = {a[0][0].x, a[0][0].y, a[0][0].z, a[0][0].w, a[0][1].x, a[0][1].y, a[0][1].z, a[0][1].w};
#pragma unroll
      for (int q = 1; q < SPLITS; ++q) {
        t[0] += a[q][0].x; t[1] += a[q][0].y; t[2] += a[q][0].z; t[3] += a[q][0].w;
        t[4] += a[q][1].x; t[5] += a[q][1].y; t[6] += a[q][1].z; t[7] += a[q][1].w;
      }
      xr[p] = fu_pack8(t);  // the projection's bf16 output
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int p = 0; p < VPT; ++p) {
    const int c0 = (p * TPR + j) * 8;
    fu_unpack8(xr[p], v[p]);
    if (HAS_RES) {
      float r[8];
      fu_unpack8(rr[p], r);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[p][e] = fu_round(r[e] + v[p][e]);  // the bf16 residual add
      if (valid) *reinterpret_cast<uint4*>(h + (size_t)row * h_stride + c0) = fu_pack8(v[p]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[p][e] * v[p][e];
  }
  ss = fu_row_sum<TPR>(ss, red);
  const float rs = rsqrtf(ss / (float)D + eps);
  if (!valid) return;  // after the last shuffle and barrier
#pragma unroll
  for (int p = 0; p < VPT; ++p) {
    const int c0 = (p * TPR + j) * 8;
    float w[8], o[8];
    fu_weight8<W_BF16>(weight, c0, w);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = (v[p][e] * rs) * (1.0f + w[e]);
    *reinterpret_cast<uint4*>(y + (size_t)row * D + c0) = fu_pack8(o);
  }
}

// ---------------------------------------------------------------------------------------------------
// silu_mul: gu [N, 2I] bf16 and out [N, I] bf16, each with a row stride; one thread per VEC outputs.
// silu(g) * u in fp32 from the bf16 inputs, one rounding (torch rounds silu(g) to bf16 first, so the
// two differ by at most about one bf16 ulp). out may be gu's gate half itself (out == gu, out_stride ==
// gu_stride): each thread loads its gate and up values before it stores over the gate, and no other
// thread reads them, so gu and out carry no __restrict__. grid: ceil(N * I / VEC / THREADS), block:
// THREADS.
template <int VEC, int THREADS>
__global__ void __launch_bounds__(THREADS)
    silu_mul_kernel(const bf16_t* gu, long long gu_stride, bf16_t* out, long long out_stride, int N, int I) {
  DS_PDL_BEGIN();  // cuda/common/pdl.cuh: before any read of the previous kernels' outputs
  static_assert(VEC == 8 || VEC == 1, "16-byte vectors or scalars");
  const int per_row = I / VEC;
  const long long idx = (long long)blockIdx.x * THREADS + threadIdx.x;
  if (idx >= (long long)N * per_row) return;
  const int row = (int)(idx / per_row);
  const int c0 = (int)(idx % per_row) * VEC;
  const bf16_t* g = gu + row * gu_stride + c0;
  bf16_t* o_row = out + row * out_stride + c0;
  if (VEC == 8) {
    float gf[8], uf[8], o[8];
    fu_unpack8(*reinterpret_cast<const uint4*>(g), gf);
    fu_unpack8(*reinterpret_cast<const uint4*>(g + I), uf);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = gf[e] / (1.0f + expf(-gf[e])) * uf[e];
    *reinterpret_cast<uint4*>(o_row) = fu_pack8(o);
  } else {
    const float gf = fu_bf16_to_f(g[0]), uf = fu_bf16_to_f(g[I]);
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(gf / (1.0f + expf(-gf)) * uf));
    o_row[0] = r;
  }
}

// ---------------------------------------------------------------------------------------------------
// qk_norm_rope_kv: for token t (blockIdx.x) the H query rows and Hkv key rows are ROWS per CTA
// (blockIdx.y); TPR = D / 8 threads own one row, 8 consecutive values each. The reference order:
//   q = bf16(rms_norm(q) * (1 + q_norm)), k likewise       (fp32 math, one rounding)
//   c, s = bf16(cos(pos * inv_freq)), bf16(sin(...))         (fp32 angle, then rounded)
//   x' = bf16(bf16(x * c) + bf16(rotate_half(x) * s))       on dims < rot (bf16 tensor ops in torch)
// q goes to q_out [T, H, D]; k, and v unchanged, to the flat cache row slot_mapping[t] (a negative slot
// writes nothing). The rotate-half partner of a value lives in another thread, so each row is staged
// once in shared memory (any rot with rot / 2 <= D / 2 works, not only multiples of 16).
template <int D, bool W_BF16>
__global__ void __launch_bounds__(128)
    qk_norm_rope_kv_kernel(const bf16_t* __restrict__ qg, int qg_st, int qg_sh, const bf16_t* __restrict__ k,
                           int k_st, int k_sh, const bf16_t* __restrict__ v, int v_st, int v_sh,
                           const void* __restrict__ q_norm, const void* __restrict__ k_norm, float eps,
                           const long long* __restrict__ positions, const float* __restrict__ inv_freq, int rot,
                           bf16_t* __restrict__ k_cache, bf16_t* __restrict__ v_cache,
                           const long long* __restrict__ slot_mapping, bf16_t* __restrict__ q_out, int H,
                           int HKV) {
  DS_PDL_BEGIN();  // cuda/common/pdl.cuh: before any read of the previous kernels' outputs
  constexpr int TPR = D / 8;
  constexpr int ROWS = 128 / TPR;
  static_assert(D % 8 == 0 && TPR <= 32 && (TPR & (TPR - 1)) == 0, "D / 8 a power of two up to 32");
  __shared__ float cs[D / 2], sn[D / 2];
  __shared__ float stage[ROWS][D];
  const int t = blockIdx.x;
  const int half = rot / 2;
  const float pos = (float)positions[t];  // torch: positions.float() * inv_freq, an fp32 product
  for (int i = threadIdx.x; i < half; i += 128) {
    const float ang = pos * inv_freq[i];
    cs[i] = fu_round(cosf(ang));
    sn[i] = fu_round(sinf(ang));
  }
  __syncthreads();

  const int grp = threadIdx.x / TPR, j = threadIdx.x % TPR;
  const int r = blockIdx.y * ROWS + grp;
  const bool valid = r < H + HKV;
  const bool is_q = r < H;
  const int c0 = j * 8;
  const bf16_t* src = is_q ? qg + (size_t)t * qg_st + (size_t)r * qg_sh : k + (size_t)t * k_st + (size_t)(r - H) * k_sh;
  uint4 xr = make_uint4(0u, 0u, 0u, 0u);
  if (valid) xr = *reinterpret_cast<const uint4*>(src + c0);
  float xv[8], w[8];
  fu_unpack8(xr, xv);
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) ss += xv[e] * xv[e];
  ss = fu_row_sum<TPR>(ss, nullptr);
  const float rs = rsqrtf(ss / (float)D + eps);
  fu_weight8<W_BF16>(is_q ? q_norm : k_norm, c0, w);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    xv[e] = fu_round((xv[e] * rs) * (1.0f + w[e]));
    stage[grp][c0 + e] = xv[e];
  }
  __syncwarp();  // a row's TPR threads are one aligned lane group of one warp
  float o[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int i = c0 + e;
    if (i < rot) {
      const bool lo = i < half;
      const int f = lo ? i : i - half;
      const float partner = stage[grp][lo ? i + half : i - half];
      const float rh = lo ? -partner : partner;
      o[e] = fu_round(fu_round(xv[e] * cs[f]) + fu_round(rh * sn[f]));
    } else {
      o[e] = xv[e];
    }
  }
  if (!valid) return;
  if (is_q) {
    *reinterpret_cast<uint4*>(q_out + ((size_t)t * H + r) * D + c0) = fu_pack8(o);
    return;
  }
  const long long slot = slot_mapping[t];
  if (slot < 0) return;
  const int hk = r - H;
  const size_t dst = ((size_t)slot * HKV + hk) * D + c0;
  *reinterpret_cast<uint4*>(k_cache + dst) = fu_pack8(o);
  *reinterpret_cast<uint4*>(v_cache + dst) =
      *reinterpret_cast<const uint4*>(v + (size_t)t * v_st + (size_t)hk * v_sh + c0);
}

#ifdef DELTASERVE_NVCC_CHECK
// the shapes the wrapper picks for Qwen3.5-4B (hidden 2560, head dim 256) and the tiny test models
template __global__ void add_rms_norm_kernel<1, 320, 1, true, true, 0>(const void*, int, const bf16_t*, int, const void*, bf16_t*, bf16_t*, int, int, float);
template __global__ void add_rms_norm_kernel<1, 320, 1, false, true, 0>(const void*, int, const bf16_t*, int, const void*, bf16_t*, bf16_t*, int, int, float);
template __global__ void add_rms_norm_kernel<1, 32, 4, true, false, 0>(const void*, int, const bf16_t*, int, const void*, bf16_t*, bf16_t*, int, int, float);
template __global__ void add_rms_norm_kernel<1, 8, 16, true, true, 0>(const void*, int, const bf16_t*, int, const void*, bf16_t*, bf16_t*, int, int, float);
template __global__ void add_rms_norm_kernel<2, 320, 1, true, true, 0>(const void*, int, const bf16_t*, int, const void*, bf16_t*, bf16_t*, int, int, float);
// the split-K partial sums of the 4B's 2,560-row projections (and of the small test models)
template __global__ void add_rms_norm_kernel<1, 320, 1, true, true, 4>(const void*, int, const bf16_t*, int, const void*, bf16_t*, bf16_t*, int, int, float);
template __global__ void add_rms_norm_kernel<1, 320, 1, true, true, 2>(const void*, int, const bf16_t*, int, const void*, bf16_t*, bf16_t*, int, int, float);
template __global__ void silu_mul_kernel<8, 256>(const bf16_t*, long long, bf16_t*, long long, int, int);
template __global__ void silu_mul_kernel<1, 256>(const bf16_t*, long long, bf16_t*, long long, int, int);
template __global__ void qk_norm_rope_kv_kernel<256, true>(const bf16_t*, int, int, const bf16_t*, int, int, const bf16_t*, int, int, const void*, const void*, float, const long long*, const float*, int, bf16_t*, bf16_t*, const long long*, bf16_t*, int, int);
template __global__ void qk_norm_rope_kv_kernel<64, false>(const bf16_t*, int, int, const bf16_t*, int, int, const bf16_t*, int, int, const void*, const void*, float, const long long*, const float*, int, bf16_t*, bf16_t*, const long long*, bf16_t*, int, int);
#endif
