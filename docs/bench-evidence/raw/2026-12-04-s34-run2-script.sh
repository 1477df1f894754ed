#!/usr/bin/env bash
# session 34, device run 2: the rest of the GPU tier on the final tree (run 1 ran the prefill-graph,
# small-model and memory files): the model and worker files first, then the ops files, each file in its
# own process (deploy/gpu-tests.sh), under one overall limit
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc2
export DELTASERVE_GPU_REPORT=$OUT/report.jsonl
echo "== model + worker: $(date +%T)"
PER_FILE_TIMEOUT=200 timeout 400 bash deploy/gpu-tests.sh /tmp/gt1 tests/model/test_model_gpu.py \
  tests/model/test_piecewise_gpu.py tests/worker/test_async_gpu.py tests/worker/test_sampling_gpu.py \
  tests/model/test_state_vmm_gpu.py tests/model/test_ssm_bf16_gpu.py
echo "exit $?"; cp /tmp/gt1/summary.txt $OUT/summary-model.txt
grep -h "FAILED\|Error" /tmp/gt1/*.log | head -8
echo "== ops: $(date +%T)"
left=$((560 - SECONDS)); echo "seconds left: $left"
PER_FILE_TIMEOUT=120 timeout $left bash deploy/gpu-tests.sh /tmp/gt2 $(bash deploy/gpu-tests.sh --list | grep tests/ops/)
echo "exit $?"; cp /tmp/gt2/summary.txt $OUT/summary-ops.txt 2>/dev/null
grep -h "FAILED\|Error" /tmp/gt2/*.log | head -8
tar czf $OUT/logs.tgz -C /tmp gt1 gt2
echo "== end: $(date +%T)"
