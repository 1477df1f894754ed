#!/usr/bin/env bash
# session 29, device run 3: the out= test as fixed after run 2 (a one-row view is contiguous, so the
# kernel takes it); then the host profile (cProfile) of prefill steps' launches, default arms, this tree.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 90 python3 -m pytest -v -p no:cacheprovider tests/ops/test_gemm.py -k "out_takes" > $OUT/tests.txt 2>&1
grep -E "PASSED|FAILED|ERROR" $OUT/tests.txt | cut -c1-120; tail -1 $OUT/tests.txt
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
timeout 200 python3 -m engine.bench.steps --model $M --load-format dummy --reps 10 --graph-capture lazy \
   --steps prefill mixed --host-profile 45 --kernel-arms $DEF > $OUT/host.txt 2>&1
grep -E "^prefill|^mixed" $OUT/host.txt | grep -v "host profile\|synchronising" | cut -c1-150
