#!/usr/bin/env bash
# session 32, device run 6: the 4B greedy CUDA-vs-reference check, then the small-model and worker GPU
# tests, verbose (run 5, the model/worker suite in one pytest, ran past its 570 s limit after 30 passes)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3
echo "== greedy: $(date +%T)"
timeout 110 python3 -m pytest -v -p no:cacheprovider -m gpu \
  "tests/model/test_model_gpu.py::test_cuda_kernels_match_torch_reference_end_to_end" > $OUT/greedy.txt 2>&1
grep -E "PASSED|FAILED|passed|failed" $OUT/greedy.txt | head -3
echo "== small model, worker: $(date +%T)"
timeout 190 python3 -m pytest -v -p no:cacheprovider -m gpu tests/model/test_small_model_gpu.py \
  tests/worker/test_sampling_gpu.py tests/worker/test_async_gpu.py --durations=8 > $OUT/rest.txt 2>&1
grep -cE "PASSED" $OUT/rest.txt; grep -E "FAILED|ERROR|passed|failed" $OUT/rest.txt | tail -6
echo "== end: $(date +%T)"
