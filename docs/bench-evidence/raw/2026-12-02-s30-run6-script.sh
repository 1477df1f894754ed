#!/usr/bin/env bash
# session 30, device run 6: the conv prefill template swept (tokens, threads, channels per thread).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cc6
timeout 200 python3 docs/bench-evidence/raw/2026-12-02-s30-conv-sweep.py 2>&1 | grep -v -i warn | tee $OUT/sweep.txt
