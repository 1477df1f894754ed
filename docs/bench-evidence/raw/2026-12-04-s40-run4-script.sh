#!/usr/bin/env bash
# session 40 run 4: issue 10's acceptance figures on the final tree: W1, W2, W3 end to end, the step
# timings, the attention kernel's fractions of copy bandwidth and matmul rate
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc4
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 260 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu $OUT/wl > $OUT/final.txt 2>&1
echo "workloads rc $?"; tail -6 $OUT/final.txt
for w in w1 w2 w3; do cp $OUT/wl/$w.json $OUT/$w.json 2>/dev/null; done
(cd $OUT && tar czf wl.tgz wl && rm -rf wl)
timeout 150 python3 -m engine.bench.steps --model .gpu/qwen3.5-4b --load-format dummy --reps 20 --graph-capture lazy > $OUT/steps.txt 2>&1
echo "steps rc $?"; grep -E "^(prefill|mixed|decode|score) |^step" $OUT/steps.txt | head -12
timeout 120 python3 -m engine.bench.attention > $OUT/attention.txt 2>&1
echo "attention rc $?"; grep -v Warn $OUT/attention.txt | tail -25
