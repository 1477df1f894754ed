#!/usr/bin/env bash
# session 31, device run 1: sm_count helper on a GPU (tests); the prefill / mixed / decode steps'
# costliest kernels on the current tree (d7b2a11) to pick the next lever.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/ccB PYTHONPATH=/tmp/site:$PWD
M=$PWD/.gpu/qwen3.5-4b
DEF="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== tests: $(date +%T)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_argmax.py tests/ops/test_gemm.py \
  tests/ops/test_gdn_chunk_split.py > $OUT/tests.txt 2>&1
tail -1 $OUT/tests.txt; grep -E "FAILED|ERROR" $OUT/tests.txt | head
echo "== steps: $(date +%T)"
timeout 200 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
  --steps prefill mixed decode --top 45 --kernel-arms $DEF > $OUT/steps.txt 2>&1
grep -v -i warn $OUT/steps.txt | grep -v "launch(\|setter\|_warn_once" | head -250
echo "== done: $(date +%T)"
