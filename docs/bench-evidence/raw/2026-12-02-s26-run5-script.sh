#!/usr/bin/env bash
# session 26, device run 5, the same tree as run 4 (f27e397): the GPU tests run 4's 420 s limit cut
# off (it passed the first eight: test_model_gpu.py's six, the 4B greedy check among them, and two of
# test_piecewise_gpu.py), named one by one (-rA).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
timeout 330 python3 -m pytest -q -rA -p no:cacheprovider -m gpu \
    tests/model/test_piecewise_gpu.py::test_prompt_scoring_through_the_pieces_matches_the_plain_forward \
    tests/model/test_small_model_gpu.py tests/model/test_ssm_bf16_gpu.py tests/model/test_state_vmm_gpu.py \
    tests/worker > $OUT/tests.txt 2>&1
grep -E "^(PASSED|FAILED|ERROR)" $OUT/tests.txt | cut -c1-150; tail -1 $OUT/tests.txt
