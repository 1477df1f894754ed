#!/usr/bin/env bash
# session 29, device run 1: the GPU tests of this session's changes (raw bf16 logits from the graphs,
# greedy argmax on them, the skinny kernel into a given out, the lazy rescale's effect), the 4B greedy
# CUDA-vs-reference check; then the cuBLAS entry-point probe at M = 16 / 32 / 64.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
R=$PWD/docs/bench-evidence/raw
echo "== tests: $(date +%T)"
timeout 330 python3 -m pytest -v -p no:cacheprovider --durations=6 \
  tests/ops/test_attention_cuda.py::test_lazy_rescale tests/ops/test_gemm.py tests/worker/test_sampling_gpu.py \
  tests/model/test_small_model_gpu.py::test_decode_graph_replay_bit_equal_to_eager \
  tests/model/test_small_model_gpu.py::test_graph_and_eager_runners_generate_same_tokens \
  tests/model/test_piecewise_gpu.py \
  tests/model/test_model_gpu.py::test_cuda_kernels_match_torch_reference_end_to_end > $OUT/tests.txt 2>&1
grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/tests.txt | sed 's/.*:://' | cut -c1-110 | sort | uniq -c | sort -rn | head -40
tail -3 $OUT/tests.txt
echo "== blas: $(date +%T)"
timeout 150 python3 $R/2026-12-02-s29-blas.py > $OUT/blas.txt 2>&1
grep -v Warn $OUT/blas.txt | tail -28
