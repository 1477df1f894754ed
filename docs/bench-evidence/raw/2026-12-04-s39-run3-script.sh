#!/usr/bin/env bash
# session 39 run 3: arm linear.split_norm - its GPU tests, then decode steps A B B A (defaults vs + the arm)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_split_norm_gpu.py tests/ops/test_fused_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; grep -E "passed|failed|Error|assert" $OUT/tests.txt | tail -8
DEF="attention.paged attention.qk_fused conv.chunk8 conv.k4 conv.vec4 decode.fused graphs.mixed graphs.pdl graphs.piecewise graphs.prefill linear.skinny norm.fused prefill.split prefill.tensorcore sample.logprobs"
for side in A B B A; do
  arms="$DEF"; [ $side = B ] && arms="$DEF linear.split_norm"
  timeout 150 python3 -m engine.bench.steps --model .gpu/qwen3.5-4b --load-format dummy --reps 20 --graph-capture lazy --steps decode mixed --kernel-arms $arms > $OUT/steps-$side.txt 2>&1
  echo "== $side rc $?"; grep -E "^(decode|mixed) " $OUT/steps-$side.txt | head -14
done
