#!/usr/bin/env bash
# session 34, device run 6: the review refactor (fill() shared with the prefill graphs, decode_arrays
# named): the decode-graph GPU tests
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc6
export DELTASERVE_GPU_REPORT=$OUT/report.jsonl
PER_FILE_TIMEOUT=80 timeout 150 bash deploy/gpu-tests.sh /tmp/gt tests/model/test_small_model_gpu.py \
  tests/worker/test_async_gpu.py tests/model/test_prefill_graphs_gpu.py
echo "exit $?"; cp /tmp/gt/summary.txt $OUT/tests-summary.txt
grep -h "FAILED\|Error" /tmp/gt/*.log | head -8
