#!/usr/bin/env bash
# session 32, device run 3: the lone-prompt graphs' attention split plan at small buckets (.exp/s32split.py)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
ARMS="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
timeout 300 python3 .exp/s32split.py $PWD/.gpu/qwen3.5-4b "$ARMS" > $OUT/split.txt 2>&1
grep -v "^{\|Warning\|setter\|launch(kernel" $OUT/split.txt | tail -12
