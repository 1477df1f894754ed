#!/usr/bin/env bash
# session 22, device run 4: the dk-split state pass (chunk.dk2) beside the dv-64 one and the one-pass
# kernel; the prep pass with the most shared-memory carveout.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/ops/test_gdn_chunk_split.py 2>&1 | tail -4 | tee $OUT/tests-split.txt
if ! grep -q " passed" $OUT/tests-split.txt || grep -q "failed\|error" $OUT/tests-split.txt; then
  echo "split tests failed: stopping"; exit 1
fi
timeout 100 python3 -m engine.bench.chunk --split-parts > $OUT/bench-parts.txt 2>&1
grep "parts" $OUT/bench-parts.txt
timeout 250 python3 -m engine.bench.chunk --split > $OUT/bench-split.txt 2>&1
grep "  split " $OUT/bench-split.txt | cut -c1-300
