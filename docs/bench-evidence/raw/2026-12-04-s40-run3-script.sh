#!/usr/bin/env bash
# session 40 run 3: the GPU test files not run on session 39's final tree: the 4B greedy check, the
# split_norm model test and every op file, one pytest per file (deploy/gpu-tests.sh)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u; nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1 2>/dev/null
files="tests/model/test_model_gpu.py tests/model/test_split_norm_model_gpu.py $(ls tests/ops/*.py | xargs grep -l 'pytest.mark.gpu' | sort | tr '\n' ' ')"
PER_FILE_TIMEOUT=200 timeout 540 deploy/gpu-tests.sh $OUT/tests $files > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
