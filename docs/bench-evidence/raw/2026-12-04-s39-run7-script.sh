#!/usr/bin/env bash
# session 39 run 7: the piecewise pieces defer the MLP's down into the next input norm as the model's
# forward does (run 6's prompt-scoring failure): the piecewise / whole-step / small-model GPU tests, then W1 + W2
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc7 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u; nvidia-smi --query-gpu=name --format=csv,noheader
files="tests/model/test_piecewise_gpu.py tests/model/test_prefill_graphs_gpu.py tests/model/test_small_model_gpu.py"
PER_FILE_TIMEOUT=120 timeout 200 deploy/gpu-tests.sh $OUT/tests $files > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt; grep -h "piecewise_prompt_scoring\|split_norm" $OUT/report.jsonl
(cd $OUT && tar czf tests.tgz tests && rm -rf tests)
ONLY="w1 w2" timeout 150 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu $OUT/wl > $OUT/final.txt 2>&1
echo "workloads rc $?"; tail -5 $OUT/final.txt
(cd $OUT && tar czf wl.tgz wl && rm -rf wl)
