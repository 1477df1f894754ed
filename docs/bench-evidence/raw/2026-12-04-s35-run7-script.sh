#!/usr/bin/env bash
# session 35 run 7: top-k (k <= 20) inside the logprobs kernel: GPU tests; op bench A (65ce8bc, torch topk) B (fused) A B
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc7 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u
PER_FILE_TIMEOUT=150 timeout 280 deploy/gpu-tests.sh $OUT/tests tests/ops/test_logprobs.py tests/worker/test_logprobs_gpu.py \
  tests/worker/test_sampling_gpu.py tests/model/test_prefill_graphs_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt; grep -E "^E " $OUT/tests/*/*.log 2>/dev/null | head -20
for arm in A B A B; do
  n=$(ls $OUT | grep -c "^lp-$arm"); f=$OUT/lp-$arm$((n+1)).txt
  if [ $arm = A ]; then timeout 100 .exp/py-base.sh -m engine.bench.logprobs --rounds 2 > $f 2>&1; else timeout 100 python3 -m engine.bench.logprobs --rounds 2 > $f 2>&1; fi
  echo "bench $arm rc $?"; grep -E "check|rows k (5|20) +kernel|op 32 rows k 0 +kernel" $f | grep -v "^|"
done
(cd $OUT && tar czf tests.tgz tests && rm -rf tests && tar czf lp.tgz lp-* && rm -f lp-*)
