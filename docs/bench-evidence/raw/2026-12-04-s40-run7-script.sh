#!/usr/bin/env bash
# session 40 run 7: K4 with streaming state loads / stores (raw/2026-12-04-s40-k4-stream.patch, in the
# tree): its GPU tests, then decode steps A B B A (A = the patch reversed)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc7
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
P=docs/bench-evidence/raw/2026-12-04-s40-k4-stream.patch
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_gdn_decode.py tests/ops/test_gdn_state_cuda.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.txt
for side in A B B A; do
  if [ $side = A ]; then patch -s -R -p1 < $P || git apply -R $P; fi
  timeout 110 python3 -m engine.bench.steps --model .gpu/qwen3.5-4b --load-format dummy --reps 30 --graph-capture lazy --steps decode > $OUT/steps-$side.txt 2>&1
  echo "== $side rc $?"; grep -E "^decode " $OUT/steps-$side.txt | awk '{print $1, $2, "replay", $7, "gdn", $9}'
  if [ $side = A ]; then patch -s -p1 < $P || git apply $P; fi
done
grep -c state_load_stream cuda/gdn/decode.cu
