#!/usr/bin/env bash
# session 35 run 8: the final tree's logprobs GPU tests (after the wrapper's takes() refactor)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc8 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u
PER_FILE_TIMEOUT=120 timeout 200 deploy/gpu-tests.sh $OUT/tests tests/ops/test_logprobs.py tests/worker/test_logprobs_gpu.py tests/ops/test_argmax.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
