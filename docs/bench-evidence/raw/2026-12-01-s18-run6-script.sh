#!/usr/bin/env bash
# session 18, device run 6: the GPU tests that failed in run 5 (after the no_gc and test fixes), then
# tests/model and tests/worker whole.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
timeout 400 python3 -m pytest -q -p no:cacheprovider tests/ops/test_gdn.py tests/worker tests/model > $OUT/tier.txt 2>&1
tail -3 $OUT/tier.txt; grep -E "^FAILED|^ERROR" $OUT/tier.txt | head
grep -E "piecewise|lifetime|16gib|budget" /tmp/deltaserve-gpu-report.jsonl | cut -c1-400
