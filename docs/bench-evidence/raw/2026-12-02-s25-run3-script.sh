#!/usr/bin/env bash
# session 25, device run 3: where a first token's time goes. W1, W2 and W3 (deploy/bench-workloads.sh)
# with loadgen recording the server's TTFT by stage (deltaserve_first_token_stage_seconds, scraped
# before and after each run); then W2 again on a server at --log-level debug for the per-step lines
# (launch / ahead / wait / update) of its prompt steps.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
timeout 300 bash deploy/bench-workloads.sh $M $D /tmp/all > $OUT/final.txt 2>&1
cp /tmp/all/w1.json /tmp/all/w2.json /tmp/all/w3.json $OUT/ 2>/dev/null
grep -E "healthy|smi peak|failed|^w[123] " $OUT/final.txt
for w in w1 w2 w3; do python3 -c "
import json; d=json.load(open('$OUT/$w.json'))
st=d.get('server_first_token_stages_ms') or {}
print('$w', 'dur', round(d['duration'],2), 'client ttft', round(d['mean_ttft_ms'],2), 'tpot', round(d['mean_tpot_ms'],2), 'failed', d['failed'])
print('   server', ' '.join(f'{k} {v:.2f}' for k, v in st.items()))"; done
python3 -m engine.cli serve --model $M --load-format dummy --port 8001 --max-num-batched-tokens 2048 \
    --num-gpu-blocks-override 1280 --max-num-seqs 32 --log-level debug > /tmp/dbg.log 2>&1 &
SRV=$!
for _ in $(seq 200); do python3 -c 'import sys,httpx; sys.exit(httpx.get("http://127.0.0.1:8001/health",timeout=1).status_code!=200)' 2>/dev/null && break; sleep 0.5; done
timeout 120 python3 -m loadgen run --dataset $D/w2.jsonl --concurrency 1 --num-warmups 2 --no-progress \
    --base-url http://127.0.0.1:8001 --result-file $OUT/w2-debug.json > /dev/null 2>&1
kill -TERM $SRV; wait $SRV
grep -E "step [0-9]+: 1024 prefill" /tmp/dbg.log | sed "s/.*\"msg\": \"//; s/\".*//" > $OUT/w2-prompt-steps.txt
grep -E "step [0-9]+: 0 prefill \+ 1 decode" /tmp/dbg.log | sed "s/.*\"msg\": \"//; s/\".*//" | tail -400 > /tmp/dec.txt
head -3 /tmp/dec.txt >> $OUT/w2-prompt-steps.txt
echo "== W2 prompt steps (debug server)"; cat $OUT/w2-prompt-steps.txt | tail -22
python3 -c "
import json; d=json.load(open('$OUT/w2-debug.json')); st=d.get('server_first_token_stages_ms') or {}
print('w2 debug: client ttft', round(d['mean_ttft_ms'],2), 'server', ' '.join(f'{k} {v:.2f}' for k, v in st.items()))"
