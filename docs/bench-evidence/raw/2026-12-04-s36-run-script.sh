#!/usr/bin/env bash
# session 36 run 4: the wide GEMM on a persistent grid (items = row block x K split): GPU tests, bench sweep;
# decode steps without (A) / with (B) the arm, A B B A, only when the M = 32 step total beats cuBLAS
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc4 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u
M=$PWD/.gpu/qwen3.5-4b
timeout 200 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/ops/test_gemm_wide.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.txt; grep -E "^FAILED|Error" $OUT/tests.txt | head -12
timeout 300 python3 -m engine.bench.gemm --sweep --sweep-seconds 1 > $OUT/gemm.txt 2>&1
echo "gemm rc $?"; grep -E "M=(16|32|64):  |wide \(|WRONG|^\| step" $OUT/gemm.txt | grep -v check | cut -c1-250
win=$(grep -E "^\| step \| 32 \|" $OUT/gemm.txt | awk -F'|' '{gsub(/[ x]/,"",$9); print ($9 > 1.0) ? 1 : 0}')
echo "wide beats cuBLAS at M = 32: ${win:-?}"
[ "${win:-0}" = 1 ] || exit 0
DEF=$(python3 -c "from engine.ops.arms import DEFAULT_ARMS; print(' '.join(sorted(DEFAULT_ARMS)))")
steps() {  # $1 = label, rest = extra arms
  local label=$1; shift
  timeout 100 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 \
     --steps decode --kernel-arms $DEF "$@" > $OUT/steps-$label.txt 2>&1
  echo "== $label rc $?"; grep -A6 "^step " $OUT/steps-$label.txt | head -6 | cut -c1-140
}
steps 1-A; steps 2-B linear.wide; steps 3-B linear.wide; steps 4-A
mkdir -p $OUT/steps && mv $OUT/steps-*.txt $OUT/steps/ && (cd $OUT && tar czf steps.tgz steps && rm -rf steps)
