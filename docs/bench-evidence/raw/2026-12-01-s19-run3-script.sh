#!/usr/bin/env bash
# session 19, device run 3 (tree 147cadd): GPU tests of the activation scratch, silu_mul's out= and the
# thread-stack change; W1, W2, W3 with nvidia-smi peaks; the step bench; the kernel cache kept.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
timeout 250 python3 -m pytest -q -p no:cacheprovider -rf tests/model/test_piecewise_gpu.py \
  tests/worker/test_memory.py "tests/ops/test_fused.py::test_silu_mul_kernel" tests/model/test_model_gpu.py \
  tests/worker/test_async_gpu.py tests/model/test_small_model_gpu.py > $OUT/tests.txt 2>&1
tail -2 $OUT/tests.txt; grep -E "^FAILED|^ERROR" $OUT/tests.txt | head
grep -hE "16gib|lifetime|thread stacks" /tmp/deltaserve-gpu-report.jsonl 2>/dev/null | cut -c1-600 | tail -4
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
idle
timeout 250 bash deploy/bench-workloads.sh $M $D /tmp/final > $OUT/final.txt 2>&1
grep -h "thread stacks\|piecewise graphs\|decode graphs:\|device memory:" /tmp/final/server-*.log | cut -c1-460 >> $OUT/final.txt
cat /tmp/final/metrics-*.txt >> $OUT/final.txt 2>/dev/null
cp /tmp/final/w1.json /tmp/final/w2.json /tmp/final/w3.json $OUT/ 2>/dev/null
grep -E "^w[123] |healthy|smi peak|^run" $OUT/final.txt; grep -h "thread stacks\|device memory:" /tmp/final/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-330
timeout 70 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" \
  --model $M --load-format dummy --reps 10 > $OUT/steps.txt 2>&1
grep -E "thread stacks|piecewise graphs:|decode graphs:|device memory:" $OUT/steps.txt | cut -c1-330; grep -A7 "^step " $OUT/steps.txt
tar -czf $OUT/kcache.tgz -C /tmp cc1 dscache 2>/dev/null; ls -la $OUT/kcache.tgz | awk '{print $5}'
