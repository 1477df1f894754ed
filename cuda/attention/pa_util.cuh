// Device helpers of paged_attention.cu: bf16 bit conversions, ldmatrix / mma.sync / cp.async wrappers,
// the XOR swizzle of the shared-memory tiles and the fused output gate. Included only by that file.
namespace pa {

typedef unsigned short bf16_t;  // raw bfloat16 bits (torch.bfloat16 storage)

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float bf16_to_f(bf16_t h) { return __uint_as_float(((unsigned)h) << 16); }
// x0 in the low half (the first PTX source operand fills the high half)
__device__ __forceinline__ unsigned pack_bf16x2(float x0, float x1) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x1), "f"(x0));
  return r;
}
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// c += a b on one 16x8 fp32 tile; a: 16x16 row-major bf16 fragment, (b0, b1): 16x8 column fragment
__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 16-byte async copy; zero fill (nothing read) when !ok
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// byte offset of 16-byte chunk `chunk` of row `row` in a [rows, D] bf16 tile (rows of D * 2 bytes)
template <int D>
__device__ __forceinline__ unsigned swz(int row, int chunk) {
  return (unsigned)(row * (D * 2) + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ float lo_f(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
// The fused output gate at the model's rounding points: bf16(attn), then bf16(attn * bf16(sigmoid(gate))).
// The fast exp and divide are a few fp32 ulps off, far below the bf16 rounding of the sigmoid that
// follows; for g < -88 the exp is inf and 1 / inf gives 0, the limit.
__device__ __forceinline__ float sigmoid_f(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }
// two adjacent outputs, packed (x0 low): each rounding takes both values in one conversion, the same
// bits as pack_bf16x2 of bf16(a) * bf16(sigmoid(g)) computed one value at a time
__device__ __forceinline__ unsigned gated2(float a0, float a1, unsigned g01) {
  const unsigned a = pack_bf16x2(a0, a1);
  const unsigned s = pack_bf16x2(sigmoid_f(lo_f(g01)), sigmoid_f(hi_f(g01)));
  return pack_bf16x2(lo_f(a) * lo_f(s), hi_f(a) * hi_f(s));
}

}  // namespace pa
