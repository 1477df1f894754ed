#!/usr/bin/env bash
# session 32, device run 7: deploy/gpu-tests.sh on a GPU (three files not run in runs 4-6 or one of them)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc7
PER_FILE_TIMEOUT=70 timeout 170 bash deploy/gpu-tests.sh $OUT/gt tests/ops/test_argmax.py \
  tests/model/test_ssm_bf16_gpu.py tests/model/test_state_vmm_gpu.py
echo "exit $?"
