// Per-architecture launch parameters for the deltaserve GDN kernels, one row per SM generation.
// The Python side (engine/ops/compile.py) parses the DS_ARCH rows below with a regex and
// instantiates the kernel templates with the same numbers, so this table is the single source.
// Columns:
//   conv_threads   threads per CTA of the conv kernels (each thread owns 8 channels)
//   delta_rg       row groups per warp in the delta-rule kernel: lanes = (32/rg) column groups x rg
//                  row groups; each thread holds dk/rg rows x 4 columns of the fp32 state
//   delta_warps    warps per CTA of the delta-rule kernel (warps are independent: no CTA sync)
//   norm_warps     warps per CTA of the gated RMSNorm (one warp per 128-wide row)
// Why these values: the delta kernel is DRAM bound in decode, so rg = 8 keeps 64 state registers
// per thread (no spill, ~120 regs) and 4 warps per CTA gives >= 8 CTAs per SM at batch 32 on the
// H200 (132 SMs) and the 5070 Ti (70 SMs) alike; shared memory stays under 48 KB static.
#pragma once

#define DS_ARCH_TABLE(X) \
  X(80, 128, 8, 4, 8)    \
  X(90, 128, 8, 4, 8)    \
  X(120, 128, 8, 4, 8)

template <int SM>
struct ArchParams;

#define DS_ARCH_ROW(SM, CONV_THREADS, DELTA_RG, DELTA_WARPS, NORM_WARPS) \
  template <>                                                           \
  struct ArchParams<SM> {                                               \
    static constexpr int conv_threads = CONV_THREADS;                   \
    static constexpr int delta_rg = DELTA_RG;                           \
    static constexpr int delta_warps = DELTA_WARPS;                     \
    static constexpr int norm_warps = NORM_WARPS;                       \
  };
DS_ARCH_TABLE(DS_ARCH_ROW)
#undef DS_ARCH_ROW

// Shared helpers (no CUDA headers: NVRTC and nvcc see the same code).
typedef unsigned short bf16_t;  // raw bfloat16 bits; torch.bfloat16 storage

__device__ __forceinline__ float bf16_to_f(bf16_t h) { return __uint_as_float(((unsigned int)h) << 16); }

// round-to-nearest-even in one instruction (sm_80+): the rounding torch applies in .to(torch.bfloat16)
// for every finite value and infinity; a NaN stays a NaN (canonical 0x7fff here, 0x7fc0 in torch).
// The bit-twiddling form this replaced cost ~6 integer instructions per value, which made the conv
// kernels instruction bound rather than DRAM bound.
__device__ __forceinline__ bf16_t f_to_bf16(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return (bf16_t)r;
}

__device__ __forceinline__ float bf16_round(float f) { return bf16_to_f(f_to_bf16(f)); }

__device__ __forceinline__ float lo_bf16(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

// a in the low half, b in the high half (the first PTX source operand fills the high half)
__device__ __forceinline__ unsigned int pack_bf16x2(float a, float b) {
  unsigned int r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
}

// 8 bf16 (one 16-byte vector) <-> 8 floats
__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  f[0] = lo_bf16(u.x); f[1] = hi_bf16(u.x); f[2] = lo_bf16(u.y); f[3] = hi_bf16(u.y);
  f[4] = lo_bf16(u.z); f[5] = hi_bf16(u.z); f[6] = lo_bf16(u.w); f[7] = hi_bf16(u.w);
}

__device__ __forceinline__ uint4 pack8(const float* f) {
  return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                    pack_bf16x2(f[6], f[7]));
}

// SiLU in fp32 on a value that is already bf16-rounded (torch upcasts internally), with the fast exp
// and the fast divide: a few fp32 ulps, far below the bf16 rounding that follows. For x < -88,
// __expf(-x) is inf and x / inf gives -0, the limit of silu. (The IEEE divide or __frcp_rn here is a
// multi-instruction sequence and made the conv prefill instruction bound.)
__device__ __forceinline__ float silu_f(float x) { return __fdividef(x, 1.0f + __expf(-x)); }
