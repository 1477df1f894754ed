// Per-arch tile rows of paged_attention.cu (included there), parsed from this file by
// engine/ops/attention/cuda.py (the wrapper instantiates exactly these).
// Prefill (4 warps, BM 64, two K/V stages): (SM, BN for D <= 128, BN for D = 256). BN = 32 at D = 256
// keeps the CTA (Q 32 KB + two K/V stages 64 KB) under sm_120's 99 KB; D <= 128 takes 64-key tiles
// (80 KB at D = 128). H200, 32 x 1,024 at D = 256: this row 1.46 ms; 8 warps x 32 keys 1.58 ms, 4 warps
// x 3 stages x 16 keys 1.75 ms. sm_80 / sm_120 rows are the sm_90 values, not measured there.
#define PA_TILES(X) \
  X(80, 64, 32)     \
  X(90, 64, 32)     \
  X(120, 64, 32)

template <int SM>
struct PaTiles;
#define PA_ROW(SM, BN_SMALL, BN_256)             \
  template <>                                    \
  struct PaTiles<SM> {                           \
    static constexpr int bn_small = BN_SMALL;    \
    static constexpr int bn_256 = BN_256;        \
  };
PA_TILES(PA_ROW)
#undef PA_ROW

// Decode (1 warp, BM 16): (SM, K/V stages, KiB of K + V per stage); BN = KIB * 1024 / (4 D), so 16
// keys at D = 256. Two tiles stay in flight while one is computed; 56 KB per CTA at D = 256 gives four
// CTAs per H200 SM, and the wrapper sizes splits to one full wave of them. H200 sweep (b32 / b64 x
// 1,101, docs/kernels.md): 3 stages 45.4 / 78.1 us, 4 stages (three CTAs per SM) 46.1 / 85.0 us,
// 32-key tiles x 2 stages 48.1 / 90.0 us.
// sm_120 has 100 KB per SM, so it takes two stages (40 KB, two CTAs per SM) rather than one 56 KB CTA;
// the sm_80 / sm_120 rows are not measured.
#define PA_DECODE(X) \
  X(80, 3, 16)       \
  X(90, 3, 16)       \
  X(120, 2, 16)

template <int SM>
struct PaDecode;
#define PA_DROW(SM, STAGES, KIB)                  \
  template <>                                     \
  struct PaDecode<SM> {                           \
    static constexpr int stages = STAGES;         \
    static constexpr int kib = KIB;               \
  };
PA_DECODE(PA_DROW)
#undef PA_DROW
