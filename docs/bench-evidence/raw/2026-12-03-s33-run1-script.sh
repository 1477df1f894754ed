#!/usr/bin/env bash
# session 33, device run 1: the GPU test files not run on the final tree of session 32 (ad9bd59's
# GPU-side mends), then engine.bench.whole (piecewise vs a whole graph of the same step)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
echo "== tests: $(date +%T)"
PER_FILE_TIMEOUT=200 timeout 390 bash deploy/gpu-tests.sh $OUT/gt tests/ops/test_fused_gpu.py tests/ops/test_norm.py \
  tests/model/test_prefill_graphs_gpu.py tests/model/test_piecewise_gpu.py tests/worker/test_memory.py
echo "exit $?"
echo "== whole: $(date +%T)"
timeout 180 python3 -m engine.bench.whole --model .gpu/qwen3.5-4b --load-format dummy --reps 20 \
  --kernel-arms conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise graphs.prefill > $OUT/whole.txt 2>&1
echo "rc $?"; tail -12 $OUT/whole.txt
echo "== end: $(date +%T)"
