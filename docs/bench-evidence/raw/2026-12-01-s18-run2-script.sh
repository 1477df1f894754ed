#!/usr/bin/env bash
# session 18, device run 2: host profile of piecewise prefill and mixed launches.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl"
timeout 300 python3 -m engine.bench.steps --model $M --load-format dummy --reps 5 --steps mixed prefill \
  --host-profile 45 --kernel-arms $DEF graphs.piecewise > $OUT/profile.txt 2>&1
grep -B2 -A60 "mixed.*cumulative order" $OUT/profile.txt | cut -c1-200
grep -A50 "mixed.*tottime order" $OUT/profile.txt | cut -c1-200
tail -4 $OUT/profile.txt
