#!/usr/bin/env bash
# session 35 run 5: W1 / W2 / W3 on the final tree
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc5
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 560 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu $OUT/wl > $OUT/final.txt 2>&1
echo "workloads rc $?"; tail -15 $OUT/final.txt
(cd $OUT && tar czf wl.tgz wl && rm -rf wl)
