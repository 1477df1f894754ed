#!/usr/bin/env bash
# session 38 run 11: the step profiler's GPU tests after the review refactor (one gap walk, _finish through _close)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc11
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_step_profile_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep -E "passed|failed|Error" $OUT/tests.txt | tail -5
