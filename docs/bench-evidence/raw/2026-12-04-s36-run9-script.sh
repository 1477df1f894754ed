#!/usr/bin/env bash
# session 36 run 9: the final tree (resolve takes the device's compute capability): GPU tests that
# resolve configs and start the engine / server on the GPU
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc9 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u
python3 -c "
from engine.config import ModelConfig
from engine.worker.resolve import resolve_model, _device_cc
c = resolve_model(ModelConfig(model='$PWD/.gpu/qwen3.5-4b', load_format='dummy'))
print('cc', _device_cc('cuda'), 'backend', c.gdn_backend, 'arms', len(c.kernel_arms))"
PER_FILE_TIMEOUT=150 timeout 400 deploy/gpu-tests.sh $OUT/tests tests/worker/test_async_gpu.py tests/worker/test_logprobs_gpu.py tests/ops/test_gdn_decode.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
