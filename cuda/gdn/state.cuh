// Loads and stores of the GDN recurrent state (ssm_state) for cuda/gdn/decode.cu, recurrent.cu and
// chunk.cu. The pool holds fp32 (ST = float) or bf16 (ST = bf16_t, --mamba-ssm-cache-dtype bfloat16);
// the kernels always compute in fp32 registers: a bf16 value widens exactly on load, and the state is
// rounded to nearest even (torch's .to(torch.bfloat16)) only when it is stored back, where the fp32
// path stores it. Four consecutive values of a state row move as one 16-byte (fp32) or 8-byte (bf16)
// vector access; the kernels' thread layouts keep those 16-byte aligned.
#pragma once

template <typename ST>
struct StateIO;

template <>
struct StateIO<float> {
  __device__ static __forceinline__ void load4(const float* p, float (&s)[4]) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    s[0] = f.x; s[1] = f.y; s[2] = f.z; s[3] = f.w;
  }
  // explicit vector store (NVVM split some float4 stores into scalar ones)
  __device__ static __forceinline__ void store4(float* p, const float (&s)[4]) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(s[0]), "f"(s[1]), "f"(s[2]), "f"(s[3])
                 : "memory");
  }
  __device__ static __forceinline__ float load1(const float* p) { return *p; }
  __device__ static __forceinline__ void store1(float* p, float x) { *p = x; }
};

template <>
struct StateIO<bf16_t> {
  __device__ static __forceinline__ void load4(const bf16_t* p, float (&s)[4]) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    s[0] = lo_bf16(u.x); s[1] = hi_bf16(u.x); s[2] = lo_bf16(u.y); s[3] = hi_bf16(u.y);
  }
  __device__ static __forceinline__ void store4(bf16_t* p, const float (&s)[4]) {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(pack_bf16x2(s[0], s[1])),
                 "r"(pack_bf16x2(s[2], s[3]))
                 : "memory");
  }
  __device__ static __forceinline__ float load1(const bf16_t* p) { return bf16_to_f(*p); }
  __device__ static __forceinline__ void store1(bf16_t* p, float x) { *p = f_to_bf16(x); }
};
