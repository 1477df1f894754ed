#!/usr/bin/env bash
# session 21, device run 1: the on-demand GDN state pool (engine/model/vmm.py). GPU tests first (the
# new regions, the padding-row test both ways, the files not run on session 20's final tree, the
# 16 GiB and lifetime tests), then W1 with the default flags (64 slots) on demand and upfront, and W1
# at 32 slots on demand.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
sv() { grep -h "piecewise graphs:\|decode graphs:\|device memory:\|capacity" $1/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-520; cat $1/metrics-*.txt 2>/dev/null | grep -v "^#" | grep -i "state_pool\|peak\|split" ; }
timeout 230 python3 -m pytest -v -p no:cacheprovider -rf tests/model/test_state_vmm_gpu.py tests/model/test_small_model_gpu.py \
  tests/model/test_ssm_bf16_gpu.py tests/ops/test_gdn_state_cuda.py tests/ops/test_gdn_chunk.py tests/worker/test_memory.py \
  "tests/model/test_model_gpu.py::test_engine_lifetime_three_rounds" > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed|Error" $OUT/tests.txt | tail -12
idle
run() { # name, extra flags
  ONLY=w1 W1_FLAGS="--max-num-batched-tokens 2048 --num-gpu-blocks-override 1280 $2" timeout 85 bash deploy/bench-workloads.sh $M $D /tmp/$1 > $OUT/$1.txt 2>&1; sv /tmp/$1 >> $OUT/$1.txt
  cp /tmp/$1/w1.json $OUT/$1-w1.json 2>/dev/null
  echo "== $1 ($2)"; grep -E "^w1 |smi peak" $OUT/$1.txt | cut -c1-300; grep -E "device memory:|capacity" $OUT/$1.txt | cut -c1-520; grep -E "peak_device|state_pool_bytes" $OUT/$1.txt
  idle
}
run w1-64-ondemand ""
run w1-64-upfront "--gdn-state-memory upfront"
run w1-32-ondemand "--max-num-seqs 32"
