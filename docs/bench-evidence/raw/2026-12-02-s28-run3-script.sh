#!/usr/bin/env bash
# session 28, device run 3, the final kernels (ca37814's attention, the prep pass as before): the model
# GPU suites (the 4B greedy CUDA-vs-reference check, the oracle configs on CUDA, graph replay vs eager,
# the small models, piecewise graphs); then decode steps at batch 1 / 8 / 32 / 64.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu --durations=8 tests/model/test_model_gpu.py \
    tests/model/test_piecewise_gpu.py tests/model/test_small_model_gpu.py > $OUT/tests.txt 2>&1
tail -14 $OUT/tests.txt; grep -E "FAILED|ERROR" $OUT/tests.txt | head -10
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
echo "== steps: $(date +%T)"
timeout 90 python3 -m engine.bench.steps --model $M --load-format dummy --reps 30 --graph-capture lazy \
   --steps decode --kernel-arms $DEF > $OUT/steps.txt 2>&1
grep -E "^step |^decode" $OUT/steps.txt | cut -c1-150 | head -6
