#!/usr/bin/env bash
# session 40 run 8: as on the users' 16 GB card - W1 and W3 with default server flags under
# --device-memory-limit 16GiB --gpu-memory-utilization 0.9 (README's command), on the final tree
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc8
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
ONLY="w1 w3" W1_FLAGS=" " W3_FLAGS=" " timeout 330 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu $OUT/wl \
  --device-memory-limit 16GiB --gpu-memory-utilization 0.9 > $OUT/final.txt 2>&1
echo "workloads rc $?"; tail -8 $OUT/final.txt
grep -h "memory\|slots\|KV" $OUT/wl/server-w1w2.log | grep -iv warn | head -8
cat $OUT/wl/metrics-w1w2.txt | grep -E "split_bytes|peak" | head -12
for w in w1 w3; do cp $OUT/wl/$w.json $OUT/$w.json 2>/dev/null; done
(cd $OUT && tar czf wl.tgz wl && rm -rf wl)
