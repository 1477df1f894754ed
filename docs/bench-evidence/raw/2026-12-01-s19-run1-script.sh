#!/usr/bin/env bash
# session 19, device run 1: the GPU tests of every commit since c1e51ef that never ran on a GPU, plus
# this session's in-place residual stream, out= cores, gating without widening copies and the shared
# graph pool; then the step bench on the new tree (start-up memory lines included).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader > $OUT/gpu.txt
timeout 400 python3 -m pytest -q -p no:cacheprovider -rf \
  tests/model/test_piecewise_gpu.py tests/ops/test_fused.py tests/ops/test_norm.py \
  "tests/ops/test_gdn.py::test_gating" tests/ops/test_attention_cuda.py::test_out_receives_exactly_the_output \
  tests/model/test_model_gpu.py tests/worker/test_memory.py tests/worker/test_async_gpu.py \
  tests/model/test_small_model_gpu.py > $OUT/tests.txt 2>&1
tail -4 $OUT/tests.txt; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head -20
timeout 140 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" \
  --model $M --load-format dummy --reps 10 > $OUT/steps.txt 2>&1
grep -E "captured|piecewise graphs|decode graphs|device memory" $OUT/steps.txt | cut -c1-300; grep -A12 "^step " $OUT/steps.txt
