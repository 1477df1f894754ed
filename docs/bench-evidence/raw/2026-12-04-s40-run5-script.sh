#!/usr/bin/env bash
# session 40 run 5: decode attention at b32 x 1,101 against issue 10's 75%-of-copy line, three runs of
# the bench (the first with the split / tile sweep), since single runs have read 72-76% across sessions
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc5
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m engine.bench.attention --skip prefill --sweep > $OUT/attn-1.txt 2>&1; echo "rc $?"
for i in 2 3; do timeout 120 python3 -m engine.bench.attention --skip prefill > $OUT/attn-$i.txt 2>&1; echo "rc $?"; done
for i in 1 2 3; do echo "== run $i"; grep -E "measured copy|^\| decode \| b32" $OUT/attn-$i.txt | head -4; done
grep -E "^  decode +b32" $OUT/attn-1.txt | sort -k5 -n | head -12
