#!/usr/bin/env bash
# session 39 run 2: explicit K-split bmm on the wide decode projections
set -u
export PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
python3 docs/bench-evidence/raw/2026-12-04-s39-run2-splitk-wide.py > $OUT/splitk-wide.txt 2>&1
echo "rc $?"; cut -c1-300 $OUT/splitk-wide.txt
