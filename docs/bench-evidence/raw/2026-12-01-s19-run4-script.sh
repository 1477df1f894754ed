#!/usr/bin/env bash
# session 19, device run 4 (tree 147cadd): the rest of the GPU tier this session's changes touch (run 3
# was cut at 250 s after 37 passes), verbose so a cut run still says which passed; then W1 with the
# bf16 recurrent state at 32 slots and at the default 64.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
timeout 290 python3 -m pytest -v -p no:cacheprovider -rf tests/model/test_small_model_gpu.py \
  tests/worker/test_async_gpu.py tests/model/test_model_gpu.py tests/worker/test_sampling_gpu.py \
  tests/model/test_ssm_bf16_gpu.py > $OUT/tests.txt 2>&1
grep -cE " PASSED" $OUT/tests.txt; grep -E " (FAILED|ERROR)|^FAILED|passed|failed" $OUT/tests.txt | tail -8
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
B="--max-num-batched-tokens 2048 --num-gpu-blocks-override 1280 --mamba-ssm-cache-dtype bfloat16"
for v in "32:--max-num-seqs 32" "64:"; do
  idle
  ONLY=w1 W1_FLAGS="$B ${v#*:}" timeout 80 bash deploy/bench-workloads.sh $M $D /tmp/b${v%%:*} > $OUT/bf16-${v%%:*}.txt 2>&1
  grep -h "device memory:" /tmp/b${v%%:*}/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-300 >> $OUT/bf16-${v%%:*}.txt
  grep -h "peak_device" /tmp/b${v%%:*}/metrics-*.txt >> $OUT/bf16-${v%%:*}.txt 2>/dev/null
  echo "== bf16 ${v%%:*} slots"; grep -E "^w1 |smi peak|device memory|peak_device" $OUT/bf16-${v%%:*}.txt | cut -c1-300
done
