#!/usr/bin/env bash
# session 22, device run 7: prefill.split on by default: the GPU suite around it (the small model,
# piecewise graphs, the 4B CUDA-vs-reference check, the 16 GiB W1 test, the kernel tests), then W1,
# W2 and W3 with the acceptance flags (deploy/bench-workloads.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
sv() { grep -h "piecewise graphs:\|decode graphs:\|device memory:\|capacity" $1/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-520; cat $1/metrics-*.txt 2>/dev/null | grep -v "^#" | grep -i "state_pool\|peak" ; }
timeout 290 python3 -m pytest -v -p no:cacheprovider -rf tests/ops/test_gdn_chunk_split.py tests/ops/test_gdn_state_cuda.py \
  tests/model/test_small_model_gpu.py tests/model/test_piecewise_gpu.py tests/worker/test_memory.py \
  tests/model/test_model_gpu.py::test_cuda_kernels_match_torch_reference_end_to_end > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed" $OUT/tests.txt | tail -8
timeout 250 bash deploy/bench-workloads.sh $M $D /tmp/all > $OUT/final.txt 2>&1; sv /tmp/all >> $OUT/final.txt
cp /tmp/all/w1.json /tmp/all/w2.json /tmp/all/w3.json $OUT/ 2>/dev/null
echo "== final"; grep -E "^w[123] |smi peak" $OUT/final.txt | cut -c1-300; grep -E "peak_device|state_pool_bytes" $OUT/final.txt
