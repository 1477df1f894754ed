#!/usr/bin/env bash
# session 23, device run 4 (commit of the tokenizer change, on top of ed48fc1): the GPU tests this
# session's calls had not run on the batch's one-copy upload (bf16 state pools, the on-demand state,
# the worker's GPU tests), then the decode steps at batch 1 / 8 / 32 / 64 with their costliest kernels.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 170 python3 -m pytest -v -p no:cacheprovider -rf -m gpu tests/model/test_ssm_bf16_gpu.py tests/model/test_state_vmm_gpu.py \
  tests/worker/test_sampling_gpu.py tests/worker/test_async_gpu.py > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed, $(grep -cE ' SKIPPED' $OUT/tests.txt) skipped"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed" $OUT/tests.txt | tail -6
(timeout 150 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy --steps decode --top 25) > $OUT/decode.txt 2>&1
grep -A6 "^step " $OUT/decode.txt | cut -c1-130
grep -A26 "decode b32: " $OUT/decode.txt | cut -c1-120
