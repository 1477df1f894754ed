#!/usr/bin/env bash
# session 20, device run 5: the GPU tests not yet run on this session's tree (verbose).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
timeout 330 python3 -m pytest -v -p no:cacheprovider -rf tests/worker/test_memory.py tests/model/test_model_gpu.py \
  tests/worker/test_async_gpu.py tests/worker/test_sampling_gpu.py tests/model/test_ssm_bf16_gpu.py \
  tests/ops/test_gdn_state_cuda.py tests/ops/test_gdn_chunk.py > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed" $OUT/tests.txt | tail -8
grep -hE "16gib|lifetime" /tmp/deltaserve-gpu-report.jsonl 2>/dev/null | cut -c1-500 | tail -3
