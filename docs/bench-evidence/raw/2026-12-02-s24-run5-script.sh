#!/usr/bin/env bash
# session 24, device run 5: the conv kernel's state write with lazy slot loads (GPU test, then steps
# base vs new once each); end-to-end A/B of this tree (mixed and prefill steps scheduled ahead, conv
# state fused) against .base (a5830fb) on W1 (concurrency 32) and W2 (concurrency 1), 3 pairs + A/A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_conv.py > $OUT/tests.txt 2>&1
tail -1 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then echo "tests failed: stopping"; exit 1; fi
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
steps() {  # $1 = tree, $2 = label
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m engine.bench.steps --model $M --load-format dummy --reps 10 \
     --graph-capture lazy --steps prefill mixed --kernel-arms $DEF --top 16) > $OUT/steps-$2.txt 2>&1
  echo "== $2"; grep -A3 "^step " $OUT/steps-$2.txt | head -4 | cut -c1-130; grep "conv_\|gdn_gating" $OUT/steps-$2.txt | head -3 | cut -c1-90
}
steps . 1-B; steps .base 2-A
printf '#!/bin/sh\ncd %s/.base && PYTHONPATH=/tmp/site:%s/.base exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/py-base; chmod +x /tmp/py-base
PY_A=/tmp/py-base timeout 230 bash deploy/ab-arms.sh $M $PWD/.gpu/w1.jsonl /tmp/ab1 "" "" 3 > $OUT/ab-w1.txt 2>&1
cp /tmp/ab1/ab.json $OUT/ab-w1.json 2>/dev/null; tail -22 $OUT/ab-w1.txt | cut -c1-120
PY_A=/tmp/py-base CONCURRENCY=1 timeout 200 bash deploy/ab-arms.sh $M $PWD/.gpu/w2.jsonl /tmp/ab2 "" "" 3 > $OUT/ab-w2.txt 2>&1
cp /tmp/ab2/ab.json $OUT/ab-w2.json 2>/dev/null; tail -22 $OUT/ab-w2.txt | cut -c1-120
