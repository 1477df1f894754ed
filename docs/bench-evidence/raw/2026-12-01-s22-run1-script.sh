#!/usr/bin/env bash
# session 22, device run 1: the split path's tests, its kernel A/B against the one-pass kernel, and the
# prefill / mixed steps with and without it.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
git log --oneline -1 2>/dev/null
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/ops/test_gdn_chunk_split.py tests/ops/test_chunk_split_plan.py tests/model/test_small_model_gpu.py::test_split_prefill_in_the_model_as_accurate 2>&1 | tail -15 | tee $OUT/tests-split.txt
if ! grep -q " passed" $OUT/tests-split.txt || grep -q "failed\|error" $OUT/tests-split.txt; then
  echo "split tests failed: stopping"; exit 1
fi
timeout 200 python3 -m engine.bench.chunk --split > $OUT/bench-split.txt 2>&1
grep "split \|^gdn\|  gdn" $OUT/bench-split.txt | cut -c1-220
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for side in A B; do
  arms=$DEF; [ $side = B ] && arms="$DEF prefill.split"
  timeout 110 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" --model $M --load-format dummy --reps 10 --steps prefill mixed --kernel-arms $arms > $OUT/steps-$side.txt 2>&1
  echo "== steps $side"; grep -A3 "^step " $OUT/steps-$side.txt; tail -1 $OUT/steps-$side.txt | cut -c1-200
done
