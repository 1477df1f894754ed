#!/usr/bin/env bash
# session 32, device run 4: the whole GPU test suite of tests/ops on the final tree, empty kernel cache
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3
echo "== ops: $(date +%T) $(git rev-parse --short HEAD 2>/dev/null)"
timeout 570 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops --durations=12 > $OUT/ops.txt 2>&1
echo "rc $?"
grep -E "FAILED|ERROR|passed|failed" $OUT/ops.txt | tail -12
echo "== end: $(date +%T)"
