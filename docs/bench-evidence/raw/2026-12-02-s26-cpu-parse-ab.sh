#!/usr/bin/env bash
# Session 26, CPU dev machine (2 cores), the embedded tiny model: W2-like requests (1,024-token
# prompts, 4 output tokens, concurrency 1, 80 requests + 2 warm-ups), the server's TTFT by stage.
# $1 = label, $2 = checkout to serve from (A: a git worktree of the commit before, B: this tree).
set -u
. /work/main/.venv/bin/activate
cd "$2"
PORT=8021
PYTHONPATH="$2" python -m engine.cli serve --port $PORT > /tmp/ttft/server-$1.log 2>&1 &
SRV=$!
for _ in $(seq 120); do python -c 'import sys,httpx; sys.exit(httpx.get("http://127.0.0.1:8021/health",timeout=1).status_code!=200)' 2>/dev/null && break; sleep 0.5; done
python -m loadgen run --base-url http://127.0.0.1:$PORT --dataset-name random --num-prompts 80 \
   --random-input-len 1024 --random-output-len 4 --max-concurrency 1 --num-warmups 2 --no-progress \
   --result-file /tmp/ttft/$1.json > /dev/null 2>&1
python -c "
import json; d=json.load(open('/tmp/ttft/$1.json')); s=d.get('server_first_token_stages_ms') or {}
print('$1', 'client ttft %.2f' % d['mean_ttft_ms'], ' '.join(f'{k} {v:.3f}' for k,v in s.items()))"
kill -TERM $SRV; wait $SRV
