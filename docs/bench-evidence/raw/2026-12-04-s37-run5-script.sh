#!/usr/bin/env bash
# session 37 run 5: W1 / W2 / W3 and the step timings on the committed tree
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc5
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 330 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu $OUT/wl > $OUT/final.txt 2>&1
echo "workloads rc $?"; tail -9 $OUT/final.txt
grep -h -E "CUBLAS_WORKSPACE_CONFIG" $OUT/wl/server-*.log | head -2 | cut -c1-400
(cd $OUT && tar czf wl.tgz wl && rm -rf wl)
timeout 230 python3 -m engine.bench.steps --model .gpu/qwen3.5-4b --load-format dummy --reps 20 --graph-capture lazy --steps prefill mixed decode > $OUT/steps.txt 2>&1
echo "steps rc $?"; grep -E "^\|" $OUT/steps.txt | head -30
