#!/usr/bin/env bash
# session 21, device run 4: the piecewise GPU tests with the fixed pool snapshot, then W1 (32 slots),
# W2 and W3 (the acceptance flags, the on-demand state by default).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
sv() { grep -h "piecewise graphs:\|decode graphs:\|device memory:\|capacity" $1/server-*.log | grep -o '"msg": "[^"]*' | cut -c1-520; cat $1/metrics-*.txt 2>/dev/null | grep -v "^#" | grep -i "state_pool\|peak" ; }
timeout 120 python3 -m pytest -v -p no:cacheprovider -rf tests/model/test_piecewise_gpu.py tests/model/test_state_vmm_gpu.py > $OUT/tests.txt 2>&1
echo "tests: $(grep -cE ' PASSED' $OUT/tests.txt) passed"; grep -E " (FAILED|ERROR)|^FAILED|^ERROR|passed|failed|^E  " $OUT/tests.txt | tail -12
timeout 260 bash deploy/bench-workloads.sh $M $D /tmp/all > $OUT/final.txt 2>&1; sv /tmp/all >> $OUT/final.txt
cp /tmp/all/w1.json /tmp/all/w2.json /tmp/all/w3.json $OUT/ 2>/dev/null
echo "== final"; grep -E "^w[123] |smi peak" $OUT/final.txt | cut -c1-300; grep -E "device memory:|capacity" $OUT/final.txt | cut -c1-520; grep -E "peak_device|state_pool_bytes" $OUT/final.txt
