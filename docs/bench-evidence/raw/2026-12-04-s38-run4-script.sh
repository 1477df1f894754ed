#!/usr/bin/env bash
# session 38 run 4: run 3's A/B again with a complete A tree (.exp/base = engine/ server/ client/
# loadgen/ of 618e10f: graphs.mixed up to 512 rows) against B (the working tree: up to 1,024), W6
# (64 x 768-token prompts, 128 out, 4 req/s open loop), 3 order-alternated pairs + A/A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3 DELTASERVE_CUDA_DIR=$PWD/cuda
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
printf '#!/bin/sh\ncd %s/.exp/base && PYTHONPATH=/tmp/site:%s/.exp/base exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/pyA; chmod +x /tmp/pyA
PY_A=/tmp/pyA REQUEST_RATE=4 CONCURRENCY=64 timeout 400 deploy/ab-arms.sh $PWD/.gpu/qwen3.5-4b $PWD/.gpu/w6.jsonl /tmp/ab "" "" 3 > $OUT/ab.txt 2>&1
echo "ab rc $?"; tail -24 $OUT/ab.txt
grep -h "whole-step graphs\|healthy\|ready" /tmp/ab/server-*.log | cut -c60-260 | head -8
cp /tmp/ab/ab.json $OUT/ab.json; (cd /tmp && tar czf $OUT/ab.tgz ab)
