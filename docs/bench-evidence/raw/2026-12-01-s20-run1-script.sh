#!/usr/bin/env bash
# session 20, device run 1 (tree: the MLP scratch, logits in the scratch, one stream): the GPU tests
# these touch (verbose, so a cut run still says what passed), then W1 at 32 slots (peak, gauge, split)
# and the step bench; the kernel cache is kept for the next calls.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader > $OUT/gpu.txt
timeout 240 python3 -m pytest -v -p no:cacheprovider -rf "tests/ops/test_fused.py::test_silu_mul_kernel" \
  tests/model/test_piecewise_gpu.py tests/worker/test_memory.py tests/model/test_small_model_gpu.py \
  tests/worker/test_async_gpu.py tests/model/test_model_gpu.py > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed" $OUT/tests.txt | tail -8
grep -hE "16gib|lifetime|thread stacks" /tmp/deltaserve-gpu-report.jsonl 2>/dev/null | cut -c1-500 | tail -3
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
idle
ONLY=w1 timeout 100 bash deploy/bench-workloads.sh $M $D /tmp/w1 > $OUT/w1.txt 2>&1
grep -h "thread stacks\|piecewise graphs\|decode graphs:\|device memory:\|capacity" /tmp/w1/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-460 >> $OUT/w1.txt
cat /tmp/w1/metrics-*.txt >> $OUT/w1.txt 2>/dev/null; cp /tmp/w1/w1.json $OUT/ 2>/dev/null
grep -E "^w1 |healthy|smi peak" $OUT/w1.txt; grep -E "device memory:|piecewise graphs|decode graphs:" $OUT/w1.txt | cut -c1-400; grep peak $OUT/w1.txt | grep deltaserve
idle
timeout 80 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" \
  --model $M --load-format dummy --reps 10 > $OUT/steps.txt 2>&1
grep -E "piecewise graphs:|decode graphs:|device memory:" $OUT/steps.txt | cut -c1-330; grep -A8 "^step " $OUT/steps.txt
tar -czf $OUT/kcache.tgz -C /tmp cc1 dscache 2>/dev/null; ls -la $OUT/kcache.tgz | awk '{print $5}'
