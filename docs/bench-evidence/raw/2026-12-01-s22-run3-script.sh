#!/usr/bin/env bash
# session 22, device run 3: the split path with one prep CTA per key head and the dv-64 state pass:
# tests, kernel A/B against the one-pass kernel, its parts, then the prefill / mixed steps B then A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/ops/test_gdn_chunk_split.py tests/ops/test_chunk_split_plan.py tests/ops/test_cuda_tables.py tests/model/test_small_model_gpu.py::test_split_prefill_in_the_model_as_accurate 2>&1 | tail -4 | tee $OUT/tests-split.txt
if ! grep -q " passed" $OUT/tests-split.txt || grep -q "failed\|error" $OUT/tests-split.txt; then
  echo "split tests failed: stopping"; exit 1
fi
timeout 200 python3 -m engine.bench.chunk --split > $OUT/bench-split.txt 2>&1
grep "  split " $OUT/bench-split.txt | cut -c1-220
timeout 100 python3 -m engine.bench.chunk --split-parts > $OUT/bench-parts.txt 2>&1
grep "parts" $OUT/bench-parts.txt
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for side in B A; do
  arms=$DEF; [ $side = B ] && arms="$DEF prefill.split"
  timeout 110 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" --model $M --load-format dummy --reps 10 --steps prefill mixed --kernel-arms $arms > $OUT/steps-$side.txt 2>&1
  echo "== steps $side"; grep -A2 "^step " $OUT/steps-$side.txt | head -3
done
