#!/usr/bin/env bash
# session 40 run 2: narrow projections at M <= 8 as skinny split-K partials + the norm's sum
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc2
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_gemm.py tests/ops/test_split_norm_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -2 $OUT/tests.txt
timeout 400 python3 docs/bench-evidence/raw/2026-12-04-s40-parts.py .gpu/qwen3.5-4b > $OUT/parts.txt 2>&1
echo "parts rc $?"; grep -E "us per pair|decode b|within|Error|error" $OUT/parts.txt | tail -20
