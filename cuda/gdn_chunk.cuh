// mma.sync / ldmatrix / cp.async helpers of cuda/gdn_chunk.cu (PTX only: sm_80, sm_90, sm_120 alike).
// The section between the "ptx helpers" markers is all the inline PTX of the kernel.
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

}  // namespace gdnc
