#!/usr/bin/env bash
# session 20, device run 3 (tree: + shared padding row, expandable segments by default, pieces off the
# graph pool): W1 at 32 slots and with the default 64 (peak, gauge, split), the step bench, then the
# GPU tests these changes touch (verbose: a cut run still says what passed).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
B="--max-num-batched-tokens 2048 --num-gpu-blocks-override 1280"
for v in "32:--max-num-seqs 32" "64:"; do
  idle
  ONLY=w1 W1_FLAGS="$B ${v#*:}" timeout 90 bash deploy/bench-workloads.sh $M $D /tmp/s${v%%:*} > $OUT/w1-${v%%:*}.txt 2>&1
  grep -h "piecewise graphs:\|decode graphs:\|device memory:\|capacity" /tmp/s${v%%:*}/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-460 >> $OUT/w1-${v%%:*}.txt
  cat /tmp/s${v%%:*}/metrics-*.txt >> $OUT/w1-${v%%:*}.txt 2>/dev/null; cp /tmp/s${v%%:*}/w1.json $OUT/w1-${v%%:*}.json
  echo "== W1 ${v%%:*} slots"; grep -E "^w1 |smi peak|device memory:|piecewise graphs:" $OUT/w1-${v%%:*}.txt | cut -c1-420; grep peak_device $OUT/w1-${v%%:*}.txt
done
idle
timeout 80 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" \
  --model $M --load-format dummy --reps 10 > $OUT/steps.txt 2>&1
grep -A8 "^step " $OUT/steps.txt
timeout 250 python3 -m pytest -v -p no:cacheprovider -rf tests/model/test_small_model_gpu.py \
  "tests/ops/test_fused.py" tests/model/test_piecewise_gpu.py tests/worker/test_memory.py \
  tests/model/test_model_gpu.py::test_engine_lifetime_three_rounds > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed" $OUT/tests.txt | tail -8
grep -hE "16gib|lifetime|shared_padding" /tmp/deltaserve-gpu-report.jsonl 2>/dev/null | cut -c1-400 | tail -3
