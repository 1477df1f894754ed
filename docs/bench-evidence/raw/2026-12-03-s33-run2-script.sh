#!/usr/bin/env bash
# session 33, device run 2: the whole-step graph GPU tests with graphs.mixed, then the step bench
# without (A) and with (B) arm graphs.mixed on the prefill and mixed kinds
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc2
DEF="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise graphs.prefill"
echo "== tests: $(date +%T)"
PER_FILE_TIMEOUT=150 timeout 200 bash deploy/gpu-tests.sh $OUT/gt tests/model/test_prefill_graphs_gpu.py
echo "exit $?"
grep -h "prefill_graph_bit_equal\|graph_serving" $OUT/gt/*.log | head -20
for side in A B; do
  arms="$DEF"; [ $side = B ] && arms="$DEF graphs.mixed"
  echo "== steps $side: $(date +%T)"
  timeout 170 python3 -m engine.bench.steps --model .gpu/qwen3.5-4b --load-format dummy --reps 10 \
    --graph-capture lazy --steps prefill mixed --kernel-arms $arms > $OUT/steps-$side.txt 2>&1
  echo "rc $?"; tail -14 $OUT/steps-$side.txt
done
echo "== end: $(date +%T)"
