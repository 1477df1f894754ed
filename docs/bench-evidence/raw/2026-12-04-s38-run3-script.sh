#!/usr/bin/env bash
# session 38 run 3: graphs.mixed up to 1,024 rows (B, the working tree) against up to 512 (A, .exp/base
# = engine/ server/ client/ loadgen/ of 618e10f), W6 (64 x 768-token prompts, 128 out, 4 req/s open loop), 3 order-alternated
# pairs + A/A with deploy/ab-arms.sh; then the whole-step graph GPU tests and W1 (peak memory) on B.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3 DELTASERVE_CUDA_DIR=$PWD/cuda
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
printf '#!/bin/sh\ncd %s/.exp/base && PYTHONPATH=/tmp/site:%s/.exp/base exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/pyA; chmod +x /tmp/pyA
PY_A=/tmp/pyA REQUEST_RATE=4 CONCURRENCY=64 timeout 330 deploy/ab-arms.sh $PWD/.gpu/qwen3.5-4b $PWD/.gpu/w6.jsonl /tmp/ab "" "" 3 > $OUT/ab.txt 2>&1
echo "ab rc $?"; tail -22 $OUT/ab.txt
grep -h "whole-step graphs" /tmp/ab/server-*.log | cut -c90-260
cp /tmp/ab/ab.json $OUT/ab.json; (cd /tmp && tar czf $OUT/ab.tgz ab)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/model/test_prefill_graphs_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -2 $OUT/tests.txt
ONLY="w1" timeout 100 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu /tmp/wl1 > $OUT/w1.txt 2>&1
echo "w1 rc $?"; tail -3 $OUT/w1.txt; grep -h "whole-step graphs" /tmp/wl1/server-*.log | cut -c90-300
