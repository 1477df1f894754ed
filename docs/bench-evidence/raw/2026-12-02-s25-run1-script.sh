#!/usr/bin/env bash
# session 25, device run 1: GPU tests of the transposed decode attention (arm attention.decode_t) and
# of the existing attention kernel; the attention bench's decode part (both kernels A B B A, then the
# tile / split sweep); decode steps at batch 1 / 8 / 32 / 64 with the default arms (A) and with
# attention.decode_t added (B), A B B A; clocks and power sampled by nvidia-smi through it all.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 250 > $OUT/smi.csv 2>&1 &
SMI=$!
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_attention_decode_t.py \
    tests/ops/test_attention_cuda.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then
  echo "tests failed: stopping"; grep -E "FAILED|Error|rel " $OUT/tests.txt | head -30; kill $SMI; exit 1; fi
echo "== bench: $(date +%T)"
timeout 240 python3 -m engine.bench.attention --skip prefill --sweep > $OUT/attention.txt 2>&1
grep -E "^\| decode|^measured" $OUT/attention.txt
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
steps() {  # $1 = label, rest = extra arms
  local label=$1; shift
  echo "== steps $label: $(date +%T)"
  timeout 100 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
     --steps decode --kernel-arms $DEF "$@" > $OUT/steps-$label.txt 2>&1
  grep -E "^step |^decode|replay" $OUT/steps-$label.txt | cut -c1-150 | head -12
}
steps 1-A; steps 2-B attention.decode_t; steps 3-B attention.decode_t; steps 4-A
kill $SMI
echo "== smi: $(wc -l < $OUT/smi.csv) samples"
