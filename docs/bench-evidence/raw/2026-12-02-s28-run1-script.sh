#!/usr/bin/env bash
# session 28, device run 1: GPU tests of the paged attention kernel (per-segment cp.async addressing,
# rescale_slack) and of the GDN split path (prep pass reading row operands as float4); the tree before
# (.base = 9f8bbbf) and after bit for bit on every test batch (raw/2026-12-02-s28-bitwise.py); the
# kernel's time per call, A B B A (A = .base), the B runs also with the lazy rescale.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache
R=$PWD/docs/bench-evidence/raw
A() { (cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA python3 "$@"); }
B() { PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB python3 "$@"; }
echo "== tests: $(date +%T)"
B -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_attention_cuda.py tests/ops/test_gdn_chunk_split.py \
  tests/ops/test_cuda_tables.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then
  echo "tests failed: stopping"; grep -E "FAILED|Error|rel " $OUT/tests.txt | head -30; exit 1; fi
echo "== bitwise: $(date +%T)"
A $R/2026-12-02-s28-bitwise.py save /tmp/before.pt > $OUT/bitwise.txt 2>&1
B $R/2026-12-02-s28-bitwise.py compare /tmp/before.pt >> $OUT/bitwise.txt 2>&1
tail -2 $OUT/bitwise.txt; grep DIFFERS $OUT/bitwise.txt | head
for r in 1-A 2-B 3-B 4-A; do
  echo "== time $r: $(date +%T)"
  if [ ${r#*-} = A ]; then A $R/2026-12-02-s28-attn-time.py > $OUT/time-$r.txt 2>&1
  else B $R/2026-12-02-s28-attn-time.py lazy > $OUT/time-$r.txt 2>&1; fi
  cat $OUT/time-$r.txt | grep -v Warning
done
