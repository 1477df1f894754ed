#!/usr/bin/env bash
# session 39 run 1: explicit K-split bmm (fp32 partials) vs F.linear on the 2,560-row decode projections
set -u
export PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python3 docs/bench-evidence/raw/2026-12-04-s39-run1-splitk.py > $OUT/splitk.txt 2>&1
echo "rc $?"; cat $OUT/splitk.txt | cut -c1-400
