#!/usr/bin/env bash
# session 34, device run 5: W3 end to end, A = 51bed9c (.base: decode graphs filled tensor by tensor,
# KV buckets 2x apart) vs B = the working tree (one pinned buffer, KV buckets 8x), 2 pairs + A/A
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc5
M=$PWD/.gpu/qwen3.5-4b
echo "== W3 A/B: $(date +%T)"
CONCURRENCY=64 PY_A=$PWD/.exp/py-base.sh timeout 250 bash deploy/ab-arms.sh $M $PWD/.gpu/w3.jsonl $OUT/ab3 "" "" 2 \
  --num-gpu-blocks-override 2600 --max-num-seqs 64 > $OUT/ab3.txt 2>&1
echo "rc $?"; tail -24 $OUT/ab3.txt
grep -h "decode graphs (batch" $OUT/ab3/server-*.log 2>/dev/null | grep -o '"msg": ".\{0,120\}' | head -4
cat $OUT/ab3/peak-memory.txt 2>/dev/null
echo "== done: $(date +%T)"
