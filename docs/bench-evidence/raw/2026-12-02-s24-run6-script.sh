#!/usr/bin/env bash
# session 24, device run 6, the final tree (c80cb63: mixed and prefill steps scheduled ahead; the conv
# fusion reverted): GPU tests of async scheduling, the small models and piecewise graphs, the 4B greedy
# CUDA-vs-reference check, then W1, W2 and W3 (deploy/bench-workloads.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_async_gpu.py tests/model/test_small_model_gpu.py \
    tests/model/test_piecewise_gpu.py > $OUT/tests.txt 2>&1
tail -1 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then echo "tests failed: stopping"; exit 1; fi
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/model/test_model_gpu.py::test_cuda_kernels_match_torch_reference_end_to_end > $OUT/greedy.txt 2>&1
tail -1 $OUT/greedy.txt
timeout 300 bash deploy/bench-workloads.sh $M $D /tmp/all > $OUT/final.txt 2>&1
cp /tmp/all/w1.json /tmp/all/w2.json /tmp/all/w3.json $OUT/ 2>/dev/null
grep -E "healthy|smi peak|failed" $OUT/final.txt
for w in w1 w2 w3; do python3 -c "import json,sys;d=json.load(open('$OUT/$w.json'));print('$w', 'dur', round(d['duration'],2), 'ttft', round(d['mean_ttft_ms'],1), 'tpot', round(d['mean_tpot_ms'],2), 'failed', d['failed'], 'peak', d.get('server_peak_memory_bytes'))"; done
