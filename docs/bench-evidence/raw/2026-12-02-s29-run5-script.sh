#!/usr/bin/env bash
# session 29, device run 5: the paged attention kernel asking L2 for its gate rows at the start (a
# prefetch hint; results must not change): its GPU tests; bit for bit against .base (= 232b644, the same
# kernel without the hint) on every test batch; time per call A B B A; prefill steps A B B A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache
R=$PWD/docs/bench-evidence/raw M=$PWD/.gpu/qwen3.5-4b
A() { (cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA timeout ${TO:-60} python3 "$@"); }
B() { PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB timeout ${TO:-60} python3 "$@"; }
echo "== tests: $(date +%T)"
TO=110 B -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_attention_cuda.py > $OUT/tests.txt 2>&1
tail -2 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then
  echo "tests failed: stopping"; grep -E "FAILED|Error|rel " $OUT/tests.txt | head -30; exit 1; fi
echo "== bitwise: $(date +%T)"
A $R/2026-12-02-s28-bitwise.py save /tmp/before.pt > $OUT/bitwise.txt 2>&1
B $R/2026-12-02-s28-bitwise.py compare /tmp/before.pt >> $OUT/bitwise.txt 2>&1
tail -1 $OUT/bitwise.txt; grep DIFFERS $OUT/bitwise.txt | head
for r in 1-A 2-B 3-B 4-A; do
  echo "== time $r: $(date +%T)"
  TO=45 ${r#*-} $R/2026-12-02-s28-attn-time.py 2>&1 | grep -v Warning > $OUT/time-$r.txt
  cat $OUT/time-$r.txt
done
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for r in 1-A 2-B 3-B 4-A; do
  echo "== steps $r: $(date +%T)"
  TO=50 ${r#*-} -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
     --steps prefill --kernel-arms $DEF > $OUT/steps-$r.txt 2>&1
  grep -E "^prefill" $OUT/steps-$r.txt | head -2 | cut -c1-140
done
