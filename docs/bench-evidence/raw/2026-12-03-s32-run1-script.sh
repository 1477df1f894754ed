#!/usr/bin/env bash
# session 32, device run 1: A = HEAD (5e30928, in .base), B = the working tree (the attention cores'
# q in the piecewise scratch's dead rows for the lone-prompt graphs). GPU tests of B; W1 + W2 peaks
# for A then B; B's host profile of the eager prefill and mixed steps.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
echo "== tests: $(date +%T)"
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -k "qk_norm_rope_kv_kernel or replay or serving" \
  tests/ops/test_fused.py tests/model/test_prefill_graphs_gpu.py tests/model/test_piecewise_gpu.py > $OUT/tests.txt 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/tests.txt | tail -6
for side in A B; do
  if [ $side = A ]; then root=$PWD/.base; else root=$PWD; fi
  echo "== $side w1 w2: $(date +%T)"
  (cd $root && PYTHONPATH=/tmp/site:$root ONLY="w1 w2" timeout 150 bash deploy/bench-workloads.sh $M $D /tmp/all-$side > $OUT/final-$side.txt 2>&1)
  cp /tmp/all-$side/w1.json $OUT/w1-$side.json; cp /tmp/all-$side/w2.json $OUT/w2-$side.json
  cp /tmp/all-$side/server-w1w2.log $OUT/server-$side.log
  grep -E "smi peak|failed|^w[12] " $OUT/final-$side.txt
  grep -h "prefill graphs\|engine ready" /tmp/all-$side/*.log | grep -o "shared graph pool grew [0-9.]* MiB\|memory={[^}]*}"
done
echo "== host profile B: $(date +%T)"
DEF="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise graphs.prefill"
PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m engine.bench.steps --model $M --load-format dummy --reps 5 --graph-capture lazy \
  --steps prefill mixed --host-profile 40 --kernel-arms $DEF > $OUT/host-profile.txt 2>&1
grep -E "^(prefill|mixed)" $OUT/host-profile.txt | head
echo "== end: $(date +%T)"
