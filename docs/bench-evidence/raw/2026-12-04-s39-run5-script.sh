#!/usr/bin/env bash
# session 39 run 5: linear.split_norm in the small model (GPU test), then W7 (32 x 128 in / 512 out,
# concurrency 32: decode steps at batch 32 throughout) A/B, 3 order-alternated pairs + A/A
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc5
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/model/test_small_model_gpu.py -k split_norm > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep -E "passed|failed|Error|assert" $OUT/tests.txt | tail -8
DEF="attention.paged attention.qk_fused conv.chunk8 conv.k4 conv.vec4 decode.fused graphs.mixed graphs.pdl graphs.piecewise graphs.prefill linear.skinny norm.fused prefill.split prefill.tensorcore sample.logprobs"
CONCURRENCY=32 timeout 300 deploy/ab-arms.sh $PWD/.gpu/qwen3.5-4b $PWD/.gpu/w7.jsonl /tmp/ab7 "" "$DEF linear.split_norm" 3 > $OUT/ab-w7.txt 2>&1
echo "w7 rc $?"; tail -20 $OUT/ab-w7.txt; cp /tmp/ab7/ab.json $OUT/ab-w7.json 2>/dev/null
