#!/usr/bin/env bash
# session 24, device run 1: what whole-step graphs would win for prefill and mixed steps (exact-shape
# capture vs piecewise vs eager, engine.bench.whole), where the idle gaps between kernels lie
# (engine.bench.steps --gaps) and the host profile of the launches (--host-profile).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/smi.txt
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
timeout 240 python3 -m engine.bench.whole --model $M --load-format dummy --kernel-arms $DEF --reps 20 > $OUT/whole.txt 2>&1
timeout 240 python3 -m engine.bench.steps --model $M --load-format dummy --reps 10 --graph-capture lazy \
   --steps prefill mixed --kernel-arms $DEF --gaps 12 --host-profile 25 > $OUT/gaps.txt 2>&1
grep -A12 "gaps between kernels" $OUT/gaps.txt | grep -v "^    [ 0-9.]* us" | cut -c1-160
grep -A6 "^step " $OUT/gaps.txt | cut -c1-140
tail -6 $OUT/whole.txt
