#!/usr/bin/env bash
# session 36 run 10: the sm_80 floor checked in the engine (ModelRunner), not in resolve_model: the
# serve command's config resolution must leave CUDA uninitialised in the API server's process
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc10 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u
python3 -c "
import torch
from engine.cli import parser, configs_from_args
ns = parser().parse_args(['serve', '--model', '$PWD/.gpu/qwen3.5-4b', '--load-format', 'dummy'])
engine, _ = configs_from_args(ns)
print('frontend: backend', engine.model.gdn_backend, 'arms', len(engine.model.kernel_arms), 'cuda initialised', torch.cuda.is_initialized())"
PER_FILE_TIMEOUT=150 timeout 300 deploy/gpu-tests.sh $OUT/tests tests/worker/test_async_gpu.py tests/model/test_small_model_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
