#!/usr/bin/env bash
# session 25, device run 4: the engine sending its outputs from the busy loop (B = f3e9794) against the
# sender thread (A = .base, a983845), equal arms and flags, order-alternated with an A/A pair
# (deploy/ab-arms.sh with PY_A): W2 (concurrency 1) 3 pairs, W1 3 pairs. Each run's JSON carries the
# server's TTFT by stage; the from_engine stage is printed per run.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
printf '#!/bin/sh\ncd %s/.base && PYTHONPATH=/tmp/site:%s/.base exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/py-base; chmod +x /tmp/py-base
stages() {  # $1 = dir
  for f in $1/run-*.json; do python3 -c "
import json,sys; d=json.load(open('$f')); s=d.get('server_first_token_stages_ms') or {}
print('  $(basename $f)', d.get('label'), 'client ttft %.2f' % d['mean_ttft_ms'], ' '.join(f'{k} {v:.2f}' for k, v in s.items()))"; done
}
PY_A=/tmp/py-base CONCURRENCY=1 timeout 260 bash deploy/ab-arms.sh $M $PWD/.gpu/w2.jsonl /tmp/ab2 "" "" 3 > $OUT/ab-w2.txt 2>&1
cp /tmp/ab2/ab.json $OUT/ab-w2.json 2>/dev/null; tail -22 $OUT/ab-w2.txt | cut -c1-120; stages /tmp/ab2 | tee $OUT/stages-w2.txt
PY_A=/tmp/py-base timeout 260 bash deploy/ab-arms.sh $M $PWD/.gpu/w1.jsonl /tmp/ab1 "" "" 3 > $OUT/ab-w1.txt 2>&1
cp /tmp/ab1/ab.json $OUT/ab-w1.json 2>/dev/null; tail -22 $OUT/ab-w1.txt | cut -c1-120; stages /tmp/ab1 | tee $OUT/stages-w1.txt
