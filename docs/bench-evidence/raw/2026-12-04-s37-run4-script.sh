#!/usr/bin/env bash
# session 37 run 4: the model and worker GPU tiers on the committed tree (the engine's cuBLAS workspace change)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc4 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader; git log --oneline -1
files=$(deploy/gpu-tests.sh --list | tr ' ' '\n' | grep -e tests/model -e tests/worker)
PER_FILE_TIMEOUT=200 timeout 580 deploy/gpu-tests.sh $OUT/tests $files > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
