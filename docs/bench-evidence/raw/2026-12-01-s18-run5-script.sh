#!/usr/bin/env bash
# session 18, device run 5: final W1, W2, W3 with the new defaults (graphs.piecewise on), empty kernel
# cache, the GPU idle first; then the GPU test tier (tests/ops, tests/model, tests/worker).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc-final5
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
git log --oneline -1 > $OUT/final.txt 2>/dev/null || true
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> $OUT/final.txt
timeout 220 bash deploy/bench-workloads.sh $M $D /tmp/final >> $OUT/final.txt 2>&1
grep -h "kernels: \|piecewise graphs\|decode graphs:\|device memory:" /tmp/final/server-*.log | cut -c1-420 >> $OUT/final.txt
cat /tmp/final/metrics-*.txt >> $OUT/final.txt
cp /tmp/final/w1.json /tmp/final/w2.json /tmp/final/w3.json $OUT/ 2>/dev/null
grep -E "^w[123] |healthy|smi peak|^run" $OUT/final.txt
CUPY_CACHE_DIR=/tmp/cc1 timeout 330 python3 -m pytest -q -p no:cacheprovider tests/ops tests/model tests/worker > $OUT/tier.txt 2>&1
tail -3 $OUT/tier.txt; grep -E "^FAILED|^ERROR" $OUT/tier.txt | head
