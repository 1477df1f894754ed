#!/usr/bin/env bash
# session 35 run 2: the committed tree (sample.logprobs default): GPU tests the change touches, op bench
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc2 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
git rev-parse --short HEAD; date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
PER_FILE_TIMEOUT=200 timeout 420 deploy/gpu-tests.sh $OUT/tests tests/ops/test_logprobs.py tests/worker/test_logprobs_gpu.py \
  tests/worker/test_sampling_gpu.py tests/model/test_prefill_graphs_gpu.py tests/model/test_small_model_gpu.py tests/worker/test_async_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
timeout 150 python3 -m engine.bench.logprobs > $OUT/bench.txt 2>&1; echo "bench rc $?"
grep check $OUT/bench.txt; tail -18 $OUT/bench.txt
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
