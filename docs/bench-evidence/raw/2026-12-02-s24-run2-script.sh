#!/usr/bin/env bash
# session 24, device run 2: engine.bench.whole again (run 1's eager pass hit unmapped state slots:
# it now goes through ModelRunner.execute, which maps them).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
timeout 240 python3 -m engine.bench.whole --model $M --load-format dummy --kernel-arms $DEF --reps 20 > $OUT/whole.txt 2>&1
grep -v "Warning\|setter\|launch(" $OUT/whole.txt | tail -12
