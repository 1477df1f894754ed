#!/usr/bin/env bash
# session 33, device run 3: W3 end to end, defaults (A) vs + graphs.mixed (B), 2 pairs + A/A; then the
# step bench on the small mixed kinds: A, B (mixed graphs up to 512 rows), C (up to 1,024 rows)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3
DEF="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise graphs.prefill"
M=.gpu/qwen3.5-4b
echo "== W3 A/B: $(date +%T)"
CONCURRENCY=64 timeout 330 bash deploy/ab-arms.sh $M .gpu/w3.jsonl $OUT/ab3 "" "$DEF graphs.mixed" 2 \
  --num-gpu-blocks-override 2600 > $OUT/ab3.txt 2>&1
echo "rc $?"; tail -22 $OUT/ab3.txt
grep -h -i "captured\|ready\|device memory split" $OUT/ab3/server-*.log 2>/dev/null | cut -c1-230 | head -14
cat $OUT/ab3/peak-memory.txt 2>/dev/null
for r in A B C; do
  arms=$DEF; [ $r != A ] && arms="$DEF graphs.mixed"
  [ $r = C ] && sed -i 's/^MIXED_MAX_TOKENS = 512/MIXED_MAX_TOKENS = 1024/' engine/worker/prefill_graphs.py
  echo "== steps $r: $(date +%T) $(grep '^MIXED_MAX_TOKENS' engine/worker/prefill_graphs.py)"
  timeout 100 python3 -m engine.bench.steps --model $M --load-format dummy --reps 10 --graph-capture lazy \
     --steps "mixed 4" "mixed 63" --kernel-arms $arms > $OUT/steps-$r.txt 2>&1
  echo "rc $?"; grep -A4 "^step " $OUT/steps-$r.txt | cut -c1-100
done
echo "== done: $(date +%T)"
