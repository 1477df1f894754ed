#!/usr/bin/env bash
# session 18, device run 4: graphs.piecewise A/B on W2 (concurrency 1: TTFT) and W1, both with
# deploy/ab-arms.sh (A = the defaults, B = + graphs.piecewise), 3 alternated pairs + A/A each.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl"
PW="$DEF graphs.piecewise"
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
CONCURRENCY=1 timeout 250 bash deploy/ab-arms.sh $M $D/w2.jsonl /tmp/ab2 "" "$PW" 3 --max-num-seqs 32 > $OUT/ab-w2.txt 2>&1
cp /tmp/ab2/ab.json $OUT/ab-w2.json; idle
timeout 300 bash deploy/ab-arms.sh $M $D/w1.jsonl /tmp/ab1 "" "$PW" 3 --max-num-seqs 32 > $OUT/ab-w1.txt 2>&1
cp /tmp/ab1/ab.json $OUT/ab-w1.json
for f in ab-w2 ab-w1; do echo "== $f"; grep -E "^\| (duration|mean_ttft|median_ttft|p99_ttft|mean_tpot|median_itl)|^A:" $OUT/$f.txt; done
