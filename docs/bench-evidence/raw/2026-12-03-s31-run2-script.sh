#!/usr/bin/env bash
# session 31, device run 2: whole-step prefill graphs (arm graphs.prefill): GPU tests; the 1 x 1,024
# prompt step A B B A; the gated norm at two rows per warp (tests, per-call times) (A = defaults, B = + graphs.prefill); W2 end to end (3 pairs + A/A).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/ccB PYTHONPATH=/tmp/site:$PWD
M=$PWD/.gpu/qwen3.5-4b
DEF="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; git log --oneline -1 2>/dev/null
echo "== tests: $(date +%T)"
timeout 300 python3 -m pytest -v -p no:cacheprovider -m gpu tests/model/test_prefill_graphs_gpu.py \
  tests/model/test_piecewise_gpu.py tests/ops/test_norm.py tests/ops/test_gdn_decode.py > $OUT/tests.txt 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/tests.txt | grep -v "PASSED" | tail -15
grep -h "prefill_graph" /tmp/deltaserve-gpu-report.jsonl 2>/dev/null | tail -8
echo "== norm: $(date +%T)"
timeout 60 python3 docs/bench-evidence/raw/2026-12-03-s31-norm-time.py 2>&1 | grep -v -i warn | tee $OUT/norm.txt
for r in 1-A 2-B 3-B 4-A; do
  arms=$DEF; [ ${r#*-} = B ] && arms="$DEF graphs.prefill"
  echo "== steps $r: $(date +%T)"
  timeout 120 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
     --steps "prefill 1" --kernel-arms $arms > $OUT/steps-$r.txt 2>&1
  grep -A1 "^step " $OUT/steps-$r.txt | cut -c1-150; grep "^prefill 1" $OUT/steps-$r.txt | tail -1
done
echo "== W2 A/B: $(date +%T)"
CONCURRENCY=1 timeout 330 bash deploy/ab-arms.sh $M .gpu/w2.jsonl $OUT/ab2 "" "$DEF graphs.prefill" 3 > $OUT/ab2.txt 2>&1
tail -25 $OUT/ab2.txt
grep -h -i "captured\|start-up\|startup\|ready in\|serving" $OUT/ab2/*.log 2>/dev/null | cut -c1-220 | head -12
cat $OUT/ab2/peak-memory.txt 2>/dev/null
cd $OUT && tar czf ab2.tgz ab2 && rm -rf ab2
echo "== done: $(date +%T)"
