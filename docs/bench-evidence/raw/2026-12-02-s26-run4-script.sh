#!/usr/bin/env bash
# session 26, device run 4, the tree with the one-round-trip combine (f27e397): the model and worker
# GPU suites (the 4B greedy CUDA-vs-reference check, graph replay vs eager, the small models,
# piecewise graphs, async scheduling, sampling, bf16 state, mapped state) and the attention tests;
# then decode steps at batch 1 / 8 / 32 / 64 twice more (engine.bench.steps --steps decode).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu tests/model tests/worker tests/ops/test_attention_cuda.py \
    > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt; grep -E "FAILED|ERROR" $OUT/tests.txt | head -10
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for r in 1 2; do
  echo "== steps $r: $(date +%T)"
  timeout 80 python3 -m engine.bench.steps --model $M --load-format dummy --reps 30 --graph-capture lazy \
     --steps decode --kernel-arms $DEF > $OUT/steps-$r.txt 2>&1
  grep -E "^step |^decode" $OUT/steps-$r.txt | cut -c1-150 | head -6
done
