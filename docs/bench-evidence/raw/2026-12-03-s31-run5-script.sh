#!/usr/bin/env bash
# session 31, device run 5, the working tree (f780ad6's successors + the lone-prompt graphs' GDN
# transients in the piecewise scratch's dead rows): GPU tests of the conv `out=`, the delta rule's
# workspace and the prefill graphs; then W1 and W2 (ONLY="w1 w2" deploy/bench-workloads.sh) for W1's peak.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
echo "== tests: $(date +%T)"
timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu -k "test_conv_prefill or workspace or replay" \
  tests/ops/test_conv.py tests/ops/test_gdn_chunk_split.py tests/model/test_prefill_graphs_gpu.py > $OUT/tests.txt 2>&1
grep -E "FAILED|ERROR|passed|failed" $OUT/tests.txt | tail -6
grep -h "prefill_graph" /tmp/deltaserve-gpu-report.jsonl 2>/dev/null | tail -7
echo "== w1 w2: $(date +%T)"
ONLY="w1 w2" timeout 120 bash deploy/bench-workloads.sh $M $D /tmp/all > $OUT/final.txt 2>&1
cp /tmp/all/w1.json /tmp/all/w2.json $OUT/ 2>/dev/null
grep -E "healthy|smi peak|failed|^w[12] " $OUT/final.txt
grep -h "engine ready" /tmp/all/*.log 2>/dev/null | grep -o "memory={[^}]*}"
echo "== end: $(date +%T)"
