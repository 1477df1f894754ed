#!/usr/bin/env bash
# session 34, device run 3: decode graphs' KV-blocks buckets, replay time and device memory (.exp/s34kv.py)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3
echo "== kv: $(date +%T)"
timeout 400 python3 .exp/s34kv.py .gpu/qwen3.5-4b > $OUT/kv.txt 2>&1
echo "rc $?"; grep -v "Warning\|warn\|setter" $OUT/kv.txt | tail -45
echo "== end: $(date +%T)"
