#!/usr/bin/env bash
# session 24, device run 4: GPU tests of the conv kernel that writes its own state, async scheduling
# on the device and the small models; the 4B greedy CUDA-vs-reference check; prefill / mixed steps,
# base (.base = a5830fb) vs this tree, A B B A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
git log -1 --format=%h > $OUT/commit.txt 2>/dev/null
timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_conv.py tests/worker/test_async_gpu.py \
    tests/model/test_small_model_gpu.py tests/model/test_piecewise_gpu.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then echo "tests failed: stopping"; grep -E "FAILED|Error" $OUT/tests.txt | head; exit 1; fi
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/model/test_model_gpu.py::test_cuda_kernels_match_torch_reference_end_to_end > $OUT/greedy.txt 2>&1
tail -1 $OUT/greedy.txt
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
steps() {  # $1 = tree, $2 = label
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m engine.bench.steps --model $M --load-format dummy --reps 10 \
     --graph-capture lazy --steps prefill mixed --kernel-arms $DEF --top 16) > $OUT/steps-$2.txt 2>&1
  echo "== $2"; grep -A4 "^step " $OUT/steps-$2.txt | grep -v "^--" | cut -c1-130
}
steps .base 1-A; steps . 2-B; steps . 3-B; steps .base 4-A
