#!/usr/bin/env bash
# session 28, device run 5: the paged attention kernel's unsplit epilogue through shared memory
# (16-byte gate loads and output stores): its GPU tests; bit for bit against the tree before
# (.base = ca37814) on every test batch; time per call A B B A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache
R=$PWD/docs/bench-evidence/raw
A() { (cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA timeout ${TO:-60} python3 "$@"); }
B() { PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB timeout ${TO:-60} python3 "$@"; }
echo "== tests: $(date +%T)"
TO=100 B -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_attention_cuda.py > $OUT/tests.txt 2>&1
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
