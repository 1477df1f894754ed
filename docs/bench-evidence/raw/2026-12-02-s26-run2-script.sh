#!/usr/bin/env bash
# session 26, device run 2: GPU tests of the paged attention kernel with the one-round-trip combine;
# decode attention per call (full and main kernel only, 2026-12-02-s26-decode-combine.py) and decode
# steps at batch 1 / 8 / 32 / 64, each in the tree before (A = .base, HEAD 0ad7641's kernels) and
# after (B), A B B A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
printf '#!/bin/sh\ncd %s/.base && PYTHONPATH=/tmp/site:%s/.base exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/py-base
printf '#!/bin/sh\ncd %s && PYTHONPATH=/tmp/site:%s exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/py-new
chmod +x /tmp/py-base /tmp/py-new
M=$PWD/.gpu/qwen3.5-4b
S=$PWD/docs/bench-evidence/raw/2026-12-02-s26-decode-combine.py
timeout 240 /tmp/py-new -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_attention_cuda.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then
  echo "tests failed: stopping"; grep -E "FAILED|Error|rel " $OUT/tests.txt | head -30; exit 1; fi
for r in 1-A 2-B 3-B 4-A; do
  case $r in *A) PY=/tmp/py-base;; *B) PY=/tmp/py-new;; esac
  echo "== combine $r: $(date +%T)" | tee -a $OUT/combine.txt
  timeout 100 $PY $S > /tmp/combine-$r.txt 2>&1
  cat /tmp/combine-$r.txt >> $OUT/combine.txt
  tail -4 /tmp/combine-$r.txt
done
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for r in 1-A 2-B 3-B 4-A; do
  case $r in *A) PY=/tmp/py-base;; *B) PY=/tmp/py-new;; esac
  echo "== steps $r: $(date +%T)"
  timeout 100 $PY -m engine.bench.steps --model $M --load-format dummy --reps 30 --graph-capture lazy \
     --steps decode --kernel-arms $DEF > $OUT/steps-$r.txt 2>&1
  grep -E "^step |^decode" $OUT/steps-$r.txt | cut -c1-150 | head -6
done
