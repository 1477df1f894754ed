#!/usr/bin/env bash
# session 39 run 4: arm linear.split_norm end to end - W1 and W3, 3 order-alternated pairs + A/A each (deploy/ab-arms.sh)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc4
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
DEF="attention.paged attention.qk_fused conv.chunk8 conv.k4 conv.vec4 decode.fused graphs.mixed graphs.pdl graphs.piecewise graphs.prefill linear.skinny norm.fused prefill.split prefill.tensorcore sample.logprobs"
CONCURRENCY=32 timeout 270 deploy/ab-arms.sh $PWD/.gpu/qwen3.5-4b $PWD/.gpu/w1.jsonl /tmp/ab1 "" "$DEF linear.split_norm" 3 > $OUT/ab-w1.txt 2>&1
echo "w1 rc $?"; tail -22 $OUT/ab-w1.txt; cp /tmp/ab1/ab.json $OUT/ab-w1.json 2>/dev/null
CONCURRENCY=64 timeout 300 deploy/ab-arms.sh $PWD/.gpu/qwen3.5-4b $PWD/.gpu/w3.jsonl /tmp/ab3 "" "$DEF linear.split_norm" 3 --num-gpu-blocks-override 2600 > $OUT/ab-w3.txt 2>&1
echo "w3 rc $?"; tail -22 $OUT/ab-w3.txt; cp /tmp/ab3/ab.json $OUT/ab-w3.json 2>/dev/null
