#!/usr/bin/env bash
# session 26, device run 1: GPU tests of the paged attention kernel with the interleaved prefill
# pipeline (arm attention.interleaved); the attention bench's prefill part with its sweep (default,
# interleaved, default again per shape); the decode combine's cost (main kernel with and without the
# combine launch); prefill and mixed steps with the default arms (A) and with attention.interleaved (B),
# A B B A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_attention_cuda.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then
  echo "tests failed: stopping"; grep -E "FAILED|Error|rel " $OUT/tests.txt | head -30; exit 1; fi
grep -E "resources|regs" $OUT/tests.txt | head
echo "== bench: $(date +%T)"
timeout 200 python3 -m engine.bench.attention --skip decode --sweep > $OUT/attention.txt 2>&1
grep -E "^\| prefill|^measured|sweep" $OUT/attention.txt | cut -c1-160
echo "== combine: $(date +%T)"
timeout 120 python3 docs/bench-evidence/raw/2026-12-02-s26-decode-combine.py > $OUT/combine.txt 2>&1
tail -8 $OUT/combine.txt
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
steps() {  # $1 = label, rest = extra arms
  local label=$1; shift
  echo "== steps $label: $(date +%T)"
  timeout 110 python3 -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
     --steps prefill mixed --kernel-arms $DEF "$@" > $OUT/steps-$label.txt 2>&1
  grep -E "^step |^prefill|^mixed|attention" $OUT/steps-$label.txt | cut -c1-150 | head -14
}
steps 1-A; steps 2-B attention.interleaved; steps 3-B attention.interleaved; steps 4-A
