#!/usr/bin/env bash
# session 32, device run 5: the GPU tests outside tests/ops (model incl. the 4B greedy CUDA-vs-reference
# check, worker, top level) on the final tree
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3
echo "== model worker: $(date +%T)"
timeout 570 python3 -m pytest -q -p no:cacheprovider -m gpu tests/model tests/worker tests/test_*.py --durations=15 > $OUT/rest.txt 2>&1
echo "rc $?"
grep -E "FAILED|ERROR|passed|failed" $OUT/rest.txt | tail -12
echo "== end: $(date +%T)"
