#!/usr/bin/env bash
# session 30, device run 1: the argmax kernel's GPU tests; micro-benchmarks (MLP in token chunks,
# argmax); decode steps with and without sample.argmax, A B B A (same tree, arms differ).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB
R=$PWD/docs/bench-evidence/raw M=$PWD/.gpu/qwen3.5-4b
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
echo "== tests: $(date +%T)"
timeout 150 python3 -m pytest -v -p no:cacheprovider tests/ops/test_argmax.py > $OUT/tests.txt 2>&1
tail -1 $OUT/tests.txt; grep -E "FAILED|ERROR" $OUT/tests.txt | head
echo "== micro: $(date +%T)"
timeout 150 python3 $R/2026-12-02-s30-micro.py mlp argmax 2>&1 | grep -v Warn | tee $OUT/micro.txt
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for r in 1-A 2-B 3-B 4-A; do
  echo "== steps $r: $(date +%T)"
  arms=$DEF; [ ${r#*-} = B ] && arms="$DEF sample.argmax"
  timeout 120 python3 -m engine.bench.steps --model $M --load-format dummy --reps 30 --graph-capture lazy \
     --steps decode --kernel-arms $arms > $OUT/steps-$r.txt 2>&1
  grep -E "^decode" $OUT/steps-$r.txt | grep -v costliest | head -4 | cut -c1-150
done
