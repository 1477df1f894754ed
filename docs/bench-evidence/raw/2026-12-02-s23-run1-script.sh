#!/usr/bin/env bash
# session 23, device run 1: the gated norm reading z where it lies (no [T*Nv, dv] copy): GPU tests;
# prefill / mixed steps base (HEAD, .base) vs new, A B B A; conv.vec4 on top, twice; marks and the
# costliest kernels on the new tree; W1 at 32 slots (peak memory).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/smi.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_norm.py tests/model/test_small_model_gpu.py tests/model/test_piecewise_gpu.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then echo "tests failed: stopping"; grep -E "FAILED|Error" $OUT/tests.txt | head; exit 1; fi
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
steps() {  # $1 = tree, $2 = label, rest = extra arms
  local tree=$1 label=$2; shift 2
  (cd $tree && PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 \
     --graph-capture lazy --steps prefill mixed --kernel-arms $DEF "$@") > $OUT/steps-$label.txt 2>&1
  echo "== $label"; grep -A4 "^step " $OUT/steps-$label.txt | grep -v "^--" | cut -c1-130
}
steps .base 1-A; steps . 2-B; steps . 3-B; steps .base 4-A
steps . 5-C conv.vec4; steps . 6-B; steps . 7-C conv.vec4
(timeout 150 python3 -m engine.bench.steps --model $M --load-format dummy --reps 10 --graph-capture lazy --steps prefill mixed \
   --kernel-arms $DEF --marks --top 30) > $OUT/marks.txt 2>&1
grep -c "" $OUT/marks.txt
ONLY=w1 timeout 200 bash deploy/bench-workloads.sh $M $PWD/.gpu /tmp/w1 > $OUT/w1.txt 2>&1
cp /tmp/w1/w1.json $OUT/ 2>/dev/null; cp /tmp/w1/server-w1w2.log $OUT/server-w1.log 2>/dev/null
grep -E "peak|healthy" $OUT/w1.txt; grep -E "peak" /tmp/w1/metrics-w1w2.txt
python3 -c "import json;d=json.load(open('$OUT/w1.json'));print('w1', round(d['duration'],2), round(d['mean_ttft_ms'],1), round(d['mean_tpot_ms'],2), d['failed'])"
