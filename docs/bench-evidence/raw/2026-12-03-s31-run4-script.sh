#!/usr/bin/env bash
# session 31, device run 4, the committed tree f780ad6 (whole-step prefill graphs up to 1,024 tokens):
# the prefill graph GPU tests, then W1, W2, W3 (deploy/bench-workloads.sh, default flags and arms) for
# the peaks and the workload figures.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== tests: $(date +%T)"
timeout 100 python3 -m pytest -v -p no:cacheprovider tests/model/test_prefill_graphs_gpu.py > $OUT/tests.txt 2>&1
grep -E "PASSED|FAILED|ERROR" $OUT/tests.txt | cut -c1-200; tail -1 $OUT/tests.txt
echo "== workloads: $(date +%T)"
timeout 230 bash deploy/bench-workloads.sh $M $D /tmp/all > $OUT/final.txt 2>&1
cp /tmp/all/w1.json /tmp/all/w2.json /tmp/all/w3.json $OUT/ 2>/dev/null
grep -E "healthy|smi peak|failed|^w[123] " $OUT/final.txt
grep -h "whole-step\|engine ready" /tmp/all/*.log 2>/dev/null | grep -o '"msg": ".\{0,420\}' | head -4
for w in w1 w2 w3; do python3 -c "
import json; d=json.load(open('$OUT/$w.json'))
st=d.get('server_first_token_stages_ms') or {}
print('$w', 'dur', round(d['duration'],2), 'client ttft', round(d['mean_ttft_ms'],2), 'p99', round(d['p99_ttft_ms'],2), 'tpot', round(d['mean_tpot_ms'],2), 'failed', d['failed'])
print('   server', ' '.join(f'{k} {v:.2f}' for k, v in st.items()))"; done
echo "== end: $(date +%T)"
