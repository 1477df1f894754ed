#!/usr/bin/env bash
# session 23, device run 3 (commit ed48fc1): GPU tests of the changed paths (the gated norm, the
# model at small shapes with piecewise graphs, the 4B CUDA-vs-reference greedy check), then W1, W2
# and W3 with the acceptance flags (deploy/bench-workloads.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
timeout 250 python3 -m pytest -v -p no:cacheprovider -rf tests/ops/test_norm.py tests/model/test_small_model_gpu.py \
  tests/model/test_piecewise_gpu.py tests/model/test_model_gpu.py::test_cuda_kernels_match_torch_reference_end_to_end > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed, $(grep -cE ' SKIPPED' $OUT/tests.txt) skipped"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed" $OUT/tests.txt | tail -6
timeout 300 bash deploy/bench-workloads.sh $M $D /tmp/all > $OUT/final.txt 2>&1
grep -h "device memory:\|capacity" /tmp/all/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-400 >> $OUT/final.txt
cat /tmp/all/metrics-*.txt >> $OUT/final.txt 2>/dev/null
cp /tmp/all/w1.json /tmp/all/w2.json /tmp/all/w3.json $OUT/ 2>/dev/null
grep -E "healthy|smi peak|failed" $OUT/final.txt
for w in w1 w2 w3; do python3 -c "import json,sys;d=json.load(open('$OUT/$w.json'));print('$w', 'dur', round(d['duration'],2), 'ttft', round(d['mean_ttft_ms'],1), 'tpot', round(d['mean_tpot_ms'],2), 'failed', d['failed'], 'peak', d.get('server_peak_memory_bytes'))"; done
