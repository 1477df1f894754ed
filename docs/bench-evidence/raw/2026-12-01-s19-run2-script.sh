#!/usr/bin/env bash
# session 19, device run 2: the fixed out= attention test; the memory probe (.gpu/s19probe.py); the
# step bench alternated between the session-18 tree (A, .gpu/base = c52c82e) and this one (B); then
# W1, W2 and W3 on this tree with nvidia-smi peaks.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu NEW=$PWD OLD=$PWD/.gpu/base
export PYTHONPATH=/tmp/site:$NEW
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/ops/test_attention_cuda.py::test_out_receives_exactly_the_output > $OUT/tests.txt 2>&1
tail -1 $OUT/tests.txt
timeout 120 python3 .gpu/s19probe.py $M > $OUT/probe.txt 2>&1; grep -v "^\s*$" $OUT/probe.txt | grep -v Warning | tail -32
steps() {
  echo "== $1 ($2)" >> $OUT/steps.txt
  (cd /tmp && PYTHONPATH=/tmp/site:$2 timeout 100 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" \
    --model $M --load-format dummy --reps 10) > /tmp/steps.txt 2>&1
  grep -E "piecewise graphs:|decode graphs:|device memory:" /tmp/steps.txt | cut -c1-330 >> $OUT/steps.txt
  grep -A7 "^step " /tmp/steps.txt >> $OUT/steps.txt
}
steps A1 $OLD; steps B1 $NEW; steps A2 $OLD; steps B2 $NEW
grep -E "^==|^prefill|^mixed|^decode b32" $OUT/steps.txt
idle() { for _ in $(seq 60); do [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" -lt 2000 ] && return; sleep 1; done; }
idle
timeout 250 bash deploy/bench-workloads.sh $M $D /tmp/final > $OUT/final.txt 2>&1
grep -h "kernels: \|piecewise graphs\|decode graphs:\|device memory:" /tmp/final/server-*.log | cut -c1-420 >> $OUT/final.txt
cat /tmp/final/metrics-*.txt >> $OUT/final.txt 2>/dev/null
cp /tmp/final/w1.json /tmp/final/w2.json /tmp/final/w3.json $OUT/ 2>/dev/null
grep -E "^w[123] |healthy|smi peak|^run|device memory:" $OUT/final.txt | cut -c1-300
