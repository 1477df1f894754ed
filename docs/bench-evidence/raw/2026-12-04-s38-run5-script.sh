#!/usr/bin/env bash
# session 38 run 5: W1 / W2 / W3 on the final tree (graphs.mixed up to 1,024 rows), no profile window
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc5
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 330 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu /tmp/wl > $OUT/final.txt 2>&1
echo "workloads rc $?"; tail -9 $OUT/final.txt
grep -h "whole-step graphs" /tmp/wl/server-*.log | cut -c90-300
for w in w1 w2 w3; do python3 - /tmp/wl/$w.json $OUT/$w.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
json.dump({k: v for k, v in r.items() if not isinstance(v, list)}, open(sys.argv[2], "w"), indent=1)
PY
done
