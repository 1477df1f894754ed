#!/usr/bin/env bash
# session 39 run 8: the remaining model / worker GPU test files on the final tree (linear.split_norm a default)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc8
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
files="tests/worker/test_memory.py tests/model/test_ssm_bf16_gpu.py tests/worker/test_step_profile_gpu.py"
PER_FILE_TIMEOUT=100 timeout 200 deploy/gpu-tests.sh $OUT/tests $files > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
