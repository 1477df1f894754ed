#!/usr/bin/env bash
# session 20, device run 2: where W1's growth above start-up goes (allocator probe through the real
# EngineCore), with torch's default allocator and with expandable segments; then W1 on the server
# with expandable segments (peak, gauge, split).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
mkdir -p /tmp/k && tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
F="--model $M --load-format dummy --max-num-batched-tokens 2048 --num-gpu-blocks-override 1280 --max-num-seqs 32"
timeout 100 python3 .gpu/s20probe.py $F < .gpu/w1.jsonl > $OUT/probe-default.txt 2>&1
grep -E "^==|segments|per pool|served" $OUT/probe-default.txt | cut -c1-700
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 100 python3 .gpu/s20probe.py $F < .gpu/w1.jsonl > $OUT/probe-expandable.txt 2>&1
grep -E "^==|segments|per pool|served|Error|error" $OUT/probe-expandable.txt | cut -c1-700 | tail -12
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
idle
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ONLY=w1 timeout 100 bash deploy/bench-workloads.sh $M $D /tmp/w1x > $OUT/w1x.txt 2>&1
grep -h "device memory:" /tmp/w1x/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-460 >> $OUT/w1x.txt
cat /tmp/w1x/metrics-*.txt >> $OUT/w1x.txt 2>/dev/null; cp /tmp/w1x/w1.json $OUT/w1x.json 2>/dev/null
grep -E "^w1 |healthy|smi peak|device memory:" $OUT/w1x.txt | cut -c1-400; grep peak_device $OUT/w1x.txt
