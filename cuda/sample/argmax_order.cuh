// torch's argmax order (ArgMaxOps), shared by the sampler's kernels so that they pick the same entry:
// a NaN beats every number and the first NaN wins; otherwise the larger value wins and ties go to
// the lower index. bf16 -> fp32 is exact, so comparing widened values compares the bf16 ones.
#pragma once

// (av, ai) better than (bv, bi); the index tie-break also settles NaN against NaN
__device__ __forceinline__ bool argmax_better(float av, int ai, float bv, int bi) {
  if (av != av) return bv == bv || ai < bi;
  if (bv != bv) return false;
  return av > bv || (av == bv && ai < bi);
}
