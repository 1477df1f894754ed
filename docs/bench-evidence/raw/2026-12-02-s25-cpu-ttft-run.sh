#!/usr/bin/env bash
# CPU: the embedded tiny model, W2-like (1,024-token prompts, concurrency 1) and a 32-stream load,
# loadgen reporting the server's TTFT stages. $1 = label
set -u
cd /work/main && . .venv/bin/activate
PORT=8010
deltaserve serve --port $PORT > /tmp/ttft/server-$1.log 2>&1 &
SRV=$!
for _ in $(seq 120); do python -c 'import sys,httpx; sys.exit(httpx.get("http://127.0.0.1:8010/health",timeout=1).status_code!=200)' 2>/dev/null && break; sleep 0.5; done
for spec in "c1:1:1024:8:24" "c16:16:128:64:64"; do
  IFS=: read name conc inl outl n <<< "$spec"
  python -m loadgen run --base-url http://127.0.0.1:$PORT --dataset-name random --num-prompts $n \
     --random-input-len $inl --random-output-len $outl --max-concurrency $conc --num-warmups 2 --no-progress \
     --result-file /tmp/ttft/$1-$name.json > /dev/null 2>&1
  python -c "
import json; d=json.load(open('/tmp/ttft/$1-$name.json')); s=d.get('server_first_token_stages_ms') or {}
print('$1 $name', 'client ttft %.2f itl %.2f dur %.2f' % (d['mean_ttft_ms'], d['mean_itl_ms'], d['duration']), ' '.join(f'{k} {v:.2f}' for k,v in s.items()))"
done
kill -TERM $SRV; wait $SRV
