#!/usr/bin/env bash
# session 36 run 8: K4 with its launch bounds' CTAs per SM as a template argument (compiles on SMs
# without a table row): its GPU tests and the bf16-state ones, and decode steps (graph replay)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc8 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u
PER_FILE_TIMEOUT=150 timeout 330 deploy/gpu-tests.sh $OUT/tests tests/ops/test_gdn_decode.py tests/ops/test_gdn_state_cuda.py tests/model/test_model_gpu.py tests/model/test_small_model_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
timeout 120 python3 -m engine.bench.steps --model $PWD/.gpu/qwen3.5-4b --load-format dummy --reps 20 --steps decode > $OUT/steps.txt 2>&1
echo "steps rc $?"; grep -A5 "^step " $OUT/steps.txt | head -6 | cut -c1-140
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
