// Logprob statistics of raw bf16 logits ([rows, V], rows a 16-byte-aligned stride apart) in one read:
// per row the log-sum-exp, the target's logprob and rank, and the top-1 entry. They replace
//   logp = log_softmax(x.float()); chosen = logp[t]; rank = (logp > chosen).sum() + 1; logp.topk(1)
// which writes and rereads an fp32 copy of the logits several times (prompt scoring: lm-eval's
// echo + logprobs requests score every prompt row; sampling with logprobs scores each new token).
//
// Math: lse = m + log(sum_i exp(x_i - m)) with m the row's max, an online sum per thread (rescaled
// when a vector raises the max), merged across threads and splits in a fixed order (deterministic).
// chosen = x_t - lse. rank counts the entries strictly above x_t (bf16 -> fp32 is exact, and
// log_softmax is monotone, so the count on x is the count on logp), plus one. The top-1 entry follows
// torch's argmax order (the first NaN, else the largest value, ties to the lowest index), its logprob
// x_top - lse. A row holding a NaN (or +inf, whose x - m is NaN) gets lse NaN, so every logprob NaN, and
// rank 1, as log_softmax gives NaN everywhere and no NaN compares greater.
//
// logprob_partial_kernel: grid (splits, rows); CTA (s, r) reduces row r's entries
// [s * chunk, min(V, (s + 1) * chunk)) (chunk a multiple of 8) into part[r, s].
// logprob_final_kernel: grid (rows), one warp per row over its `splits` partials; writes lse, chosen,
// rank (int64), top_v, top_i (int64).
#include "common/arch_params.cuh"
#include "sample/argmax_order.cuh"

struct LpPart {
  float m;    // max over the chunk (-inf when empty)
  float s;    // sum of exp(x - m) (0 when m is -inf)
  float bv;   // top-1 value
  int bi;     // top-1 index
  int count;  // entries > x_t
  int nan;    // 1 when the chunk holds a NaN
};

#define LP_LOG2E 1.4426950408889634f
#define LP_NEG_INF (-__int_as_float(0x7f800000))


// (m, s) of the union of two sets: the larger max, each sum rescaled to it; an empty side (-inf) adds 0
__device__ __forceinline__ void lp_merge_ms(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == LP_NEG_INF) return;  // both empty
  s = (m == LP_NEG_INF ? 0.f : s * exp2f((m - mn) * LP_LOG2E)) +
      (m2 == LP_NEG_INF ? 0.f : s2 * exp2f((m2 - mn) * LP_LOG2E));
  m = mn;
}

__device__ __forceinline__ void lp_merge(LpPart& a, const LpPart& b) {
  lp_merge_ms(a.m, a.s, b.m, b.s);
  if (argmax_better(b.bv, b.bi, a.bv, a.bi)) {
    a.bv = b.bv;
    a.bi = b.bi;
  }
  a.count += b.count;
  a.nan |= b.nan;
}

// lane 0 ends with the warp's merge, in a fixed tree order
__device__ __forceinline__ LpPart lp_warp(LpPart p) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    LpPart q;
    q.m = __shfl_down_sync(0xffffffffu, p.m, o);
    q.s = __shfl_down_sync(0xffffffffu, p.s, o);
    q.bv = __shfl_down_sync(0xffffffffu, p.bv, o);
    q.bi = __shfl_down_sync(0xffffffffu, p.bi, o);
    q.count = __shfl_down_sync(0xffffffffu, p.count, o);
    q.nan = __shfl_down_sync(0xffffffffu, p.nan, o);
    lp_merge(p, q);
  }
  return p;
}

__device__ __forceinline__ LpPart lp_empty() { return LpPart{LP_NEG_INF, 0.f, LP_NEG_INF, 0x7fffffff, 0, 0}; }

// UNROLL 16-byte vectors in flight per thread before any arithmetic (each row is read once, from DRAM)
template <int THREADS, int UNROLL>
__global__ void __launch_bounds__(THREADS)
    logprob_partial_kernel(const bf16_t* __restrict__ x, long long row_stride, int V, int chunk,
                           const long long* __restrict__ targets, LpPart* __restrict__ part) {
  const int s = blockIdx.x, r = blockIdx.y, splits = gridDim.x;
  const int lo = s * chunk;
  const int hi = min(V, lo + chunk);
  const bf16_t* row = x + (size_t)r * row_stride;
  const long long t = min(max(targets[r], 0LL), (long long)V - 1);  // the caller's are in range
  const float xt = bf16_to_f(row[t]);
  LpPart p = lp_empty();
  for (int base = lo + threadIdx.x * 8; base < hi; base += THREADS * 8 * UNROLL) {
    float f[UNROLL][8];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + u * THREADS * 8;
      if (i < hi) {
        unpack8(*reinterpret_cast<const uint4*>(row + i), f[u]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) f[u][e] = LP_NEG_INF;
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float vm = LP_NEG_INF;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float v = f[u][e];
        const int i = base + u * THREADS * 8 + e;
        vm = fmaxf(vm, v);  // fmaxf drops NaN; the flag below keeps it
        p.nan |= v != v;
        p.count += v > xt;
        if (i < hi && argmax_better(v, i, p.bv, p.bi)) {  // the -inf padding past hi is no entry
          p.bv = v;
          p.bi = i;
        }
      }
      if (vm > p.m) {
        p.s = p.m == LP_NEG_INF ? 0.f : p.s * exp2f((p.m - vm) * LP_LOG2E);
        p.m = vm;
      }
      if (p.m != LP_NEG_INF) {
#pragma unroll
        for (int e = 0; e < 8; ++e) p.s += exp2f((f[u][e] - p.m) * LP_LOG2E);
      }
    }
  }
  p = lp_warp(p);
  __shared__ LpPart warp_part[THREADS / 32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) warp_part[w] = p;
  __syncthreads();
  if (w == 0) {
    p = lane < THREADS / 32 ? warp_part[lane] : lp_empty();
    p = lp_warp(p);
    if (lane == 0) part[(size_t)r * splits + s] = p;
  }
}

__global__ void __launch_bounds__(32)
    logprob_final_kernel(const LpPart* __restrict__ part, int splits, const bf16_t* __restrict__ x,
                         long long row_stride, int V, const long long* __restrict__ targets, float* __restrict__ lse,
                         float* __restrict__ chosen, long long* __restrict__ rank, float* __restrict__ top_v,
                         long long* __restrict__ top_i) {
  const int r = blockIdx.x;
  LpPart p = lp_empty();
  for (int s = threadIdx.x; s < splits; s += 32) lp_merge(p, part[(size_t)r * splits + s]);
  p = lp_warp(p);
  if (threadIdx.x != 0) return;
  const float xt = bf16_to_f(x[(size_t)r * row_stride + min(max(targets[r], 0LL), (long long)V - 1)]);
  const float l = p.nan ? __int_as_float(0x7fc00000) : p.m + logf(p.s);
  lse[r] = l;
  chosen[r] = xt - l;
  rank[r] = l != l ? 1 : (long long)p.count + 1;  // NaN logprobs compare greater than nothing
  top_v[r] = p.bv - l;
  top_i[r] = p.bi;
}

#ifdef DELTASERVE_NVCC_CHECK
// CI compile check (tests/test_cuda_compile.py): the instantiation engine/ops/sample/logprobs.py launches.
template __global__ void logprob_partial_kernel<256, 4>(const bf16_t*, long long, int, int, const long long*,
                                                        LpPart*);
#endif
