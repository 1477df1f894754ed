#!/usr/bin/env bash
# session 26, device run 3, the tree with the one-round-trip combine (f27e397): W1, W2, W3
# (deploy/bench-workloads.sh, each with the server's TTFT by stage); then W2 end to end against the
# tree before (A = .base, 0ad7641), equal arms and flags, order-alternated with an A/A pair
# (deploy/ab-arms.sh with PY_A, concurrency 1, 3 pairs).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
printf '#!/bin/sh\ncd %s/.base && PYTHONPATH=/tmp/site:%s/.base exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/py-base; chmod +x /tmp/py-base
timeout 300 bash deploy/bench-workloads.sh $M $D /tmp/all > $OUT/final.txt 2>&1
cp /tmp/all/w1.json /tmp/all/w2.json /tmp/all/w3.json $OUT/ 2>/dev/null
grep -E "healthy|smi peak|failed|^w[123] " $OUT/final.txt
for w in w1 w2 w3; do python3 -c "
import json; d=json.load(open('$OUT/$w.json'))
st=d.get('server_first_token_stages_ms') or {}
print('$w', 'dur', round(d['duration'],2), 'client ttft', round(d['mean_ttft_ms'],2), 'tpot', round(d['mean_tpot_ms'],2), 'failed', d['failed'])
print('   server', ' '.join(f'{k} {v:.2f}' for k, v in st.items()))"; done
echo "== W2 A/B: $(date +%T)"
PY_A=/tmp/py-base CONCURRENCY=1 timeout 250 bash deploy/ab-arms.sh $M $D/w2.jsonl /tmp/ab2 "" "" 3 > $OUT/ab-w2.txt 2>&1
cp /tmp/ab2/ab.json $OUT/ab-w2.json 2>/dev/null; tail -22 $OUT/ab-w2.txt | cut -c1-140
