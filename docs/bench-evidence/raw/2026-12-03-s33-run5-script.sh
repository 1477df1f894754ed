#!/usr/bin/env bash
# session 33, device run 5 (the final tree): the GPU tests the change touches (decode graph capture,
# whole-step graphs as defaults, the memory plan), then W1 + W2 on the defaults (graphs.mixed on)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc5
export DELTASERVE_GPU_REPORT=$OUT/report.jsonl
echo "== tests: $(date +%T)"
PER_FILE_TIMEOUT=150 timeout 300 bash deploy/gpu-tests.sh /tmp/gt tests/model/test_small_model_gpu.py \
  tests/model/test_prefill_graphs_gpu.py tests/worker/test_memory.py
echo "exit $?"; cp /tmp/gt/summary.txt $OUT/tests-summary.txt
grep -h "FAILED\|Error" /tmp/gt/*.log | head -10
echo "== workloads: $(date +%T)"
ONLY="w1 w2" timeout 200 bash deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu /tmp/all > $OUT/final.txt 2>&1
cp /tmp/all/w1.json /tmp/all/w2.json $OUT/ 2>/dev/null
grep -E "healthy|smi peak|failed|^w[12] " $OUT/final.txt
grep -h "whole-step\|engine ready\|decode graphs\|piecewise graphs:" /tmp/all/*.log 2>/dev/null | grep -o '"msg": ".\{0,300\}' | head -6
echo "== end: $(date +%T)"
