#!/usr/bin/env bash
# session 39 run 6: linear.split_norm a default - the model / worker GPU tests (minus the 4B-shape and
# bf16-state files, whose decode batches stay at 8 rows or below), the op tests, then W1 / W2 / W3
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc6
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
files="tests/ops/test_split_norm_gpu.py tests/model/test_piecewise_gpu.py tests/model/test_prefill_graphs_gpu.py tests/model/test_small_model_gpu.py tests/model/test_state_vmm_gpu.py tests/worker/test_async_gpu.py tests/worker/test_logprobs_gpu.py tests/worker/test_sampling_gpu.py"
PER_FILE_TIMEOUT=150 timeout 300 deploy/gpu-tests.sh $OUT/tests $files > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
timeout 270 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu $OUT/wl > $OUT/final.txt 2>&1
echo "workloads rc $?"; tail -9 $OUT/final.txt
(cd $OUT && tar czf wl.tgz wl && rm -rf wl)
