#!/usr/bin/env bash
# session 40 run 1: skinny GEMM L2 prefetch variants - the GEMM tests, per-shape PDL chains, decode b1 / b8 replays
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_gemm.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -3 $OUT/tests.txt
timeout 330 python3 docs/bench-evidence/raw/2026-12-04-s40-prefetch.py .gpu/qwen3.5-4b > $OUT/prefetch.txt 2>&1
echo "prefetch rc $?"; grep -v Warning $OUT/prefetch.txt | grep -v "^  " | tail -30
