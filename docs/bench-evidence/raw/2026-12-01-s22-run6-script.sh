#!/usr/bin/env bash
# session 22, device run 6: end-to-end A/B of prefill.split (deploy/ab-arms.sh, order-alternated pairs
# + an A/A pair): W2 (concurrency 1, 4 pairs), then W1 (concurrency 32, 3 pairs).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
SP="$DEF prefill.split"
CONCURRENCY=1 timeout 270 bash deploy/ab-arms.sh $M $D/w2.jsonl /tmp/ab2 "" "$SP" 4 > $OUT/ab-w2.txt 2>&1
cp /tmp/ab2/ab.json $OUT/ab-w2.json 2>/dev/null
grep -v "^WARNING" $OUT/ab-w2.txt | tail -22
timeout 300 bash deploy/ab-arms.sh $M $D/w1.jsonl /tmp/ab1 "" "$SP" 3 --max-num-seqs 32 > $OUT/ab-w1.txt 2>&1
cp /tmp/ab1/ab.json $OUT/ab-w1.json 2>/dev/null
grep -v "^WARNING" $OUT/ab-w1.txt | tail -22
