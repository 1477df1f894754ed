#!/usr/bin/env bash
# session 22, device run 5: the split path with its final state-pass rule (dk split for one sequence,
# dv 64 otherwise): tests, then the prefill / mixed steps alternated A B B A, then the parts.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/ops/test_gdn_chunk_split.py tests/ops/test_chunk_split_plan.py tests/ops/test_gdn_chunk.py tests/model/test_small_model_gpu.py::test_split_prefill_in_the_model_as_accurate 2>&1 | tail -4 | tee $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -q "failed\|error" $OUT/tests.txt; then
  echo "tests failed: stopping"; exit 1
fi
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
i=0
for side in A B B A; do
  i=$((i+1)); arms=$DEF; [ $side = B ] && arms="$DEF prefill.split"
  timeout 110 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" --model $M --load-format dummy --reps 10 --steps prefill mixed --kernel-arms $arms > $OUT/steps-$i-$side.txt 2>&1
  echo "== steps $i $side"; grep -A3 "^step " $OUT/steps-$i-$side.txt | head -4
done
timeout 100 python3 -m engine.bench.chunk --split-parts > $OUT/bench-parts.txt 2>&1
grep "parts" $OUT/bench-parts.txt | head -8
