#!/usr/bin/env bash
# session 23, device run 2: the batch's metadata in one pinned copy + the gated norm without the z copy:
# the GPU tests of the model, worker and norm; marks and steps on the new tree; conv.vec4 vs the
# defaults end to end on W2 (deploy/ab-arms.sh, order-alternated pairs + an A/A pair).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
timeout 230 python3 -m pytest -q -p no:cacheprovider -m gpu tests/model tests/worker tests/ops/test_norm.py tests/ops/test_conv.py > $OUT/tests.txt 2>&1
tail -2 $OUT/tests.txt; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
(timeout 120 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy --steps prefill mixed \
   --kernel-arms $DEF --marks) > $OUT/marks.txt 2>&1
grep -A4 "^step " $OUT/marks.txt | cut -c1-130; grep -A4 "marks (host" $OUT/marks.txt | cut -c1-60
CONCURRENCY=1 timeout 260 bash deploy/ab-arms.sh $M $D/w2.jsonl /tmp/ab2 "" "$DEF conv.vec4" 4 > $OUT/ab-w2.txt 2>&1
cp /tmp/ab2/ab.json $OUT/ab-w2.json 2>/dev/null
grep -v "^WARNING" $OUT/ab-w2.txt | tail -22
