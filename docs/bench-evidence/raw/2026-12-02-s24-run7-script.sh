#!/usr/bin/env bash
# session 24, device run 7: end-to-end A/B of this tree (mixed and prefill steps scheduled ahead)
# against .base (a5830fb) on W3 (128 x 256 in / 1,024 out, concurrency 64, 2,600 KV blocks), 2 pairs + A/A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
printf '#!/bin/sh\ncd %s/.base && PYTHONPATH=/tmp/site:%s/.base exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/py-base; chmod +x /tmp/py-base
PY_A=/tmp/py-base CONCURRENCY=64 timeout 270 bash deploy/ab-arms.sh $M $PWD/.gpu/w3.jsonl /tmp/ab3 "" "" 2 \
    --num-gpu-blocks-override 2600 --max-num-seqs 64 > $OUT/ab-w3.txt 2>&1
cp /tmp/ab3/ab.json $OUT/ab-w3.json 2>/dev/null; tail -21 $OUT/ab-w3.txt | cut -c1-120
