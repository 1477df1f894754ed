#!/usr/bin/env bash
# session 37 run 6: the 16 GiB test with its new cuBLAS workspace check
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc6
timeout 300 python3 -m pytest -q -m gpu tests/worker/test_memory.py -rf -s > $OUT/tests.txt 2>&1; echo "rc $?"
grep -E "passed|failed|cublas|Error|assert" $OUT/tests.txt | tail -8
