#!/usr/bin/env bash
# session 35 run 4: the rest of the GPU tier on the final tree (the files run 2 did not run)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc4 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
files=$(deploy/gpu-tests.sh --list | grep -v -e test_logprobs -e test_sampling_gpu -e test_prefill_graphs_gpu -e test_small_model_gpu -e test_async_gpu)
PER_FILE_TIMEOUT=240 timeout 570 deploy/gpu-tests.sh $OUT/tests $files > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
