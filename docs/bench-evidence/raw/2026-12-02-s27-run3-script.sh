#!/usr/bin/env bash
# session 27, device run 3: the wide skinny GEMM rebuilt (warps split rows, x shared through L1): its
# GPU tests and the M <= 8 kernel's; engine.bench.gemm at M = 1-32 with the wide kernel's launch and
# split sweep; decode steps without (A) / with (B) the arm, A B B A; if the wide kernel's decode-step
# GEMM total at M = 32 beats cuBLAS, W1 end to end, 2 order-alternated pairs + A/A (deploy/ab-arms.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 120 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/ops/test_gemm_wide.py tests/ops/test_gemm.py > $OUT/tests.txt 2>&1
tail -1 $OUT/tests.txt; grep -E "^FAILED|Error" $OUT/tests.txt | head -8
timeout 150 python3 -m engine.bench.gemm --sweep --sweep-seconds 1 > $OUT/gemm.txt 2>&1
grep -E "M=(16|32):|wide \(|WRONG|step \|" $OUT/gemm.txt | cut -c1-200
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
steps() {  # $1 = label, rest = extra arms
  local label=$1; shift
  timeout 80 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 \
     --steps decode --kernel-arms $DEF "$@" > $OUT/steps-$label.txt 2>&1
  echo "== $label"; grep -A5 "^step " $OUT/steps-$label.txt | head -5 | cut -c1-130
}
steps 1-A; steps 2-B linear.wide; steps 3-B linear.wide; steps 4-A
win=$(grep -E "^\| step \| 32 \|" $OUT/gemm.txt | awk -F'|' '{gsub(/[ x]/,"",$9); print ($9 > 1.0) ? 1 : 0}')
echo "wide beats cuBLAS at M = 32: ${win:-?}"
if [ "${win:-0}" = 1 ]; then
  timeout 200 bash deploy/ab-arms.sh $M .gpu/w1.jsonl /tmp/ab "$DEF" "$DEF linear.wide" 2 > $OUT/ab-w1.txt 2>&1
  tail -22 $OUT/ab-w1.txt
  cp /tmp/ab/ab.json $OUT/ab-w1.json 2>/dev/null
fi
