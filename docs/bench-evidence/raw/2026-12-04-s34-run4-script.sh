#!/usr/bin/env bash
# session 34, device run 4: decode graphs filled from one pinned buffer (decode_arrays) and KV buckets
# 8x apart under the paged attention: the GPU tests on the decode graphs and the memory plan, the fill
# old vs new (.exp/s34kv2.py), then W1, W2, W3 on the defaults (start-up, peak memory)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc4
export DELTASERVE_GPU_REPORT=$OUT/report.jsonl
echo "== tests: $(date +%T)"
PER_FILE_TIMEOUT=100 timeout 220 bash deploy/gpu-tests.sh /tmp/gt tests/model/test_small_model_gpu.py \
  tests/worker/test_async_gpu.py tests/worker/test_sampling_gpu.py tests/model/test_prefill_graphs_gpu.py \
  tests/worker/test_memory.py
echo "exit $?"; cp /tmp/gt/summary.txt $OUT/tests-summary.txt
grep -h "FAILED\|Error" /tmp/gt/*.log | head -8
echo "== fill: $(date +%T)"
timeout 100 python3 .exp/s34kv2.py .gpu/qwen3.5-4b > $OUT/fill.txt 2>&1
echo "rc $?"; grep -v "Warning\|warn\|setter\|launch(" $OUT/fill.txt | tail -16
echo "== workloads: $(date +%T)"
timeout 200 bash deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu /tmp/all > $OUT/final.txt 2>&1
tar czf $OUT/workloads.tgz -C /tmp all
grep -E "healthy|smi peak|failed|^w[123] " $OUT/final.txt
grep -h "decode graphs\|whole-step graphs" /tmp/all/server-*.log | grep -o '"msg": ".\{0,200\}' | head -6
echo "== end: $(date +%T)"
