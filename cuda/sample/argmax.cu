// Greedy sampling's argmax over each row of the raw logits ([rows, V], bf16 or fp32, rows a
// 16-byte-aligned stride apart), in two launches so that a decode batch of a few rows still reads
// its logits with the whole device: torch's reduction gives each row one CTA (a batch of 32 rows
// of the 4B's 248,320-entry vocabulary read at ~0.8 TB/s on the H200).
//
// Order (torch's ArgMaxOps, so the token is the one logits.argmax(-1) gives): a NaN beats every
// number and the first NaN wins; otherwise the larger value wins and ties go to the lower index.
// bf16 -> fp32 is exact, so comparing the widened values compares the bf16 ones.
//
// argmax_partial_kernel: grid (splits, rows); CTA (s, r) reduces row r's entries
// [s * chunk, min(V, (s + 1) * chunk)) (chunk a multiple of the vector width) into part[r, s].
// argmax_final_kernel: grid (rows), one warp per row over its `splits` partials, writes out[r] (int64).
#include "common/arch_params.cuh"
#include "sample/argmax_order.cuh"

struct ArgBest {
  float v;
  int i;
};


__device__ __forceinline__ ArgBest argmax_warp(ArgBest b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_down_sync(0xffffffffu, b.v, o);
    const int i = __shfl_down_sync(0xffffffffu, b.i, o);
    if (argmax_better(v, i, b.v, b.i)) b = ArgBest{v, i};
  }
  return b;
}

template <typename T> struct ArgVec;
template <> struct ArgVec<bf16_t> {
  static constexpr int N = 8;
  __device__ __forceinline__ static void load(const bf16_t* p, float* f) {
    unpack8(*reinterpret_cast<const uint4*>(p), f);
  }
};
template <> struct ArgVec<float> {
  static constexpr int N = 4;
  __device__ __forceinline__ static void load(const float* p, float* f) {
    const float4 u = *reinterpret_cast<const float4*>(p);
    f[0] = u.x; f[1] = u.y; f[2] = u.z; f[3] = u.w;
  }
};

// UNROLL vectors in flight per thread before any compare, so each thread keeps several 16-byte
// loads outstanding (the rows are read once, from DRAM)
template <typename T, int THREADS, int UNROLL>
__global__ void __launch_bounds__(THREADS)
    argmax_partial_kernel(const T* __restrict__ x, long long row_stride, int V, int chunk,
                          ArgBest* __restrict__ part) {
  constexpr int N = ArgVec<T>::N;
  const int s = blockIdx.x, r = blockIdx.y, splits = gridDim.x;
  const int lo = s * chunk;
  const int hi = min(V, lo + chunk);
  const T* row = x + (size_t)r * row_stride;
  ArgBest best{-__int_as_float(0x7f800000), 0x7fffffff};  // -inf at an index past every real one
  for (int base = lo + threadIdx.x * N; base < hi; base += THREADS * N * UNROLL) {
    float f[UNROLL][N];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + u * THREADS * N;
      if (i < hi) {
        ArgVec<T>::load(row + i, f[u]);
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e) f[u][e] = -__int_as_float(0x7f800000);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const int i = base + u * THREADS * N + e;
        if (i < hi && argmax_better(f[u][e], i, best.v, best.i)) best = ArgBest{f[u][e], i};
      }
  }
  best = argmax_warp(best);
  __shared__ ArgBest warp_best[THREADS / 32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) warp_best[w] = best;
  __syncthreads();
  if (w == 0) {
    best = lane < THREADS / 32 ? warp_best[lane] : ArgBest{-__int_as_float(0x7f800000), 0x7fffffff};
    best = argmax_warp(best);
    if (lane == 0) part[(size_t)r * splits + s] = best;
  }
}

__global__ void __launch_bounds__(32)
    argmax_final_kernel(const ArgBest* __restrict__ part, int splits, long long* __restrict__ out) {
  const int r = blockIdx.x;
  ArgBest best{-__int_as_float(0x7f800000), 0x7fffffff};
  for (int s = threadIdx.x; s < splits; s += 32) {
    const ArgBest p = part[(size_t)r * splits + s];
    if (argmax_better(p.v, p.i, best.v, best.i)) best = p;
  }
  best = argmax_warp(best);
  if (threadIdx.x == 0) out[r] = best.i;
}

#ifdef DELTASERVE_NVCC_CHECK
// CI compile check (tests/test_cuda_compile.py): the instantiations engine/ops/sample/cuda.py launches.
template __global__ void argmax_partial_kernel<bf16_t, 256, 4>(const bf16_t*, long long, int, int, ArgBest*);
template __global__ void argmax_partial_kernel<float, 256, 4>(const float*, long long, int, int, ArgBest*);
#endif
