#!/usr/bin/env bash
# session 22, device run 8: compact entries (the tiles' lower blocks only, 21,760 bytes): tests,
# kernel A/B, steps, and W1 at 32 slots (its peak device memory).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
sv() { grep -h "device memory:\|capacity" $1/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-520; cat $1/metrics-*.txt 2>/dev/null | grep -v "^#" | grep -i "state_pool\|peak" ; }
timeout 150 python3 -m pytest -q -p no:cacheprovider -rf tests/ops/test_gdn_chunk_split.py tests/ops/test_gdn_chunk.py \
  tests/model/test_small_model_gpu.py::test_split_prefill_in_the_model_as_accurate tests/model/test_small_model_gpu.py::test_no_kernel_is_built_after_start_up > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
timeout 100 python3 -m engine.bench.chunk --split > $OUT/bench-split.txt 2>&1
grep "  split .*x.*: one-pass" $OUT/bench-split.txt | cut -c1-300
timeout 90 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" --model $M --load-format dummy --reps 10 --steps prefill mixed > $OUT/steps.txt 2>&1
grep -A4 "^step " $OUT/steps.txt | head -4
ONLY="w1" timeout 120 bash deploy/bench-workloads.sh $M $D /tmp/w1 > $OUT/w1.txt 2>&1; sv /tmp/w1 >> $OUT/w1.txt
cp /tmp/w1/w1.json $OUT/ 2>/dev/null
grep -E "^w1 |smi peak|peak_device" $OUT/w1.txt | cut -c1-200
