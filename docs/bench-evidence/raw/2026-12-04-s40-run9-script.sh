#!/usr/bin/env bash
# session 40 run 9: the prefill attention tile with D split across warp pairs (raw/2026-12-04-s40-dsplit.patch,
# in the tree for this run): correctness against the fp32 reference, then timings beside today's tile
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc9
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 280 python3 docs/bench-evidence/raw/2026-12-04-s40-dsplit.py > $OUT/dsplit.txt 2>&1
echo "rc $?"; grep -v "Warning\|warn" $OUT/dsplit.txt | tail -40
