#!/usr/bin/env bash
# session 27, device run 2: the wide skinny GEMM (arm linear.wide): its GPU tests and the M <= 8
# kernel's; engine.bench.gemm at M = 1-32 with the split sweep; decode steps without / with the arm,
# A B B A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 240 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/ops/test_gemm_wide.py tests/ops/test_gemm.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt; grep -E "^FAILED|Error" $OUT/tests.txt | head -8
timeout 200 python3 -m engine.bench.gemm --sweep --sweep-seconds 20 > $OUT/gemm.txt 2>&1
grep -E "M=(16|32)|WRONG|step \|" $OUT/gemm.txt | cut -c1-170
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
steps() {  # $1 = label, rest = extra arms
  local label=$1; shift
  timeout 100 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 \
     --steps decode --kernel-arms $DEF "$@" > $OUT/steps-$label.txt 2>&1
  echo "== $label"; grep -A5 "^step " $OUT/steps-$label.txt | head -6 | cut -c1-130
}
steps 1-A; steps 2-B linear.wide; steps 3-B linear.wide; steps 4-A
