#!/usr/bin/env bash
# session 20, device run 4 (tree: + attention partials capped at 16 MiB, the GDN core's delta rule into
# its output buffer with the norm in place): W1 + W2 + W3 (the acceptance flags), W1 with the default
# 64 slots, W1 on the tree before this session (9bde7ab) in the same call, then the GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu R=$PWD
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
sv() { grep -h "piecewise graphs:\|decode graphs:\|device memory:\|capacity" $1/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-460; cat $1/metrics-*.txt 2>/dev/null; }
timeout 230 bash deploy/bench-workloads.sh $M $D /tmp/all > $OUT/final.txt 2>&1; sv /tmp/all >> $OUT/final.txt
cp /tmp/all/w1.json /tmp/all/w2.json /tmp/all/w3.json $OUT/ 2>/dev/null
echo "== new tree"; grep -E "^w[123] |smi peak|device memory:" $OUT/final.txt | cut -c1-420; grep peak_device $OUT/final.txt
idle
ONLY=w1 W1_FLAGS="--max-num-batched-tokens 2048 --num-gpu-blocks-override 1280" timeout 90 bash deploy/bench-workloads.sh $M $D /tmp/s64 > $OUT/w1-64.txt 2>&1; sv /tmp/s64 >> $OUT/w1-64.txt
echo "== new tree, 64 slots"; grep -E "^w1 |smi peak|device memory:" $OUT/w1-64.txt | cut -c1-420; grep peak_device $OUT/w1-64.txt
idle
(cd /tmp && PYTHONPATH=/tmp/site:$R/.gpu/base:$R ONLY=w1 timeout 90 bash $R/deploy/bench-workloads.sh $M $D /tmp/old > $OUT/w1-old.txt 2>&1); sv /tmp/old >> $OUT/w1-old.txt
echo "== 9bde7ab"; grep -E "^w1 |smi peak|device memory:" $OUT/w1-old.txt | cut -c1-420; grep peak_device $OUT/w1-old.txt
timeout 200 python3 -m pytest -v -p no:cacheprovider -rf tests/model/test_piecewise_gpu.py tests/model/test_small_model_gpu.py \
  tests/ops/test_fused.py tests/ops/test_norm.py tests/ops/test_attention_cuda.py tests/worker/test_memory.py > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed" $OUT/tests.txt | tail -8
