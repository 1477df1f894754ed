#!/usr/bin/env bash
# session 21, device run 3: the on-demand state pool's GPU tests (fixed: baseline after warm kernels,
# the replay test snapshots only the slots it uses) and the rest of the GPU suite; W1 with the default
# flags, on demand (A) vs upfront (B), 3 alternated pairs + A/A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
sv() { grep -h "piecewise graphs:\|decode graphs:\|device memory:\|capacity" $1/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-520; cat $1/metrics-*.txt 2>/dev/null | grep -v "^#" | grep -i "state_pool\|peak" ; }
timeout 300 python3 -m pytest -v -p no:cacheprovider -rf tests/model/test_state_vmm_gpu.py tests/model/test_small_model_gpu.py \
  tests/model/test_piecewise_gpu.py tests/worker/test_async_gpu.py tests/worker/test_sampling_gpu.py tests/model/test_model_gpu.py > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed" $OUT/tests.txt | tail -12
idle
FLAGS_B="--gdn-state-memory upfront" timeout 200 bash deploy/ab-arms.sh $M $D/w1.jsonl /tmp/ab "" "" 3 > $OUT/ab.txt 2>&1
cp /tmp/ab/ab.json $OUT/ab.json 2>/dev/null; cat $OUT/ab.txt | tail -30
