#!/usr/bin/env bash
# session 25, device run 6 (diagnostic, uncommitted debug stamps): where W2's from_engine goes on the
# H200 host, and what torch.cuda.mem_get_info costs there.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
mkdir -p /tmp/ttft
python3 - <<'PY' | tee $OUT/meminfo.txt
import time, torch
torch.cuda.init(); x = torch.empty(1 << 20, device="cuda"); torch.cuda.synchronize()
for name, fn in (("mem_get_info", lambda: torch.cuda.mem_get_info(0)), ("memory_reserved", lambda: torch.cuda.memory_reserved(0))):
    for _ in range(50): fn()
    t = time.perf_counter(); n = 2000
    for _ in range(n): fn()
    print(f"{name}: {(time.perf_counter() - t) / n * 1e6:.1f} us per call")
PY
python3 -m engine.cli serve --model $M --load-format dummy --port 8001 --max-num-batched-tokens 2048 \
    --num-gpu-blocks-override 1280 --max-num-seqs 32 > /tmp/srv.log 2>&1 &
SRV=$!
for _ in $(seq 200); do python3 -c 'import sys,httpx; sys.exit(httpx.get("http://127.0.0.1:8001/health",timeout=1).status_code!=200)' 2>/dev/null && break; sleep 0.5; done
timeout 120 python3 -m loadgen run --dataset $D/w2.jsonl --concurrency 1 --num-warmups 2 --no-progress \
    --base-url http://127.0.0.1:8001 --result-file $OUT/w2.json > /dev/null 2>&1
kill -TERM $SRV; wait $SRV
cp /tmp/ttft/debug-hops.txt $OUT/ 2>/dev/null
echo "token->update_done update->stats stats->send send->recv recv->decoded decoded->handled (ms, mean over first tokens)"
awk '{for(i=1;i<=NF;i++){s[i]+=$i}; n++} END {for(i=1;i<=NF;i++) printf "%.3f ", s[i]/n; print "n=" n}' /tmp/ttft/debug-hops.txt
python3 -c "
import json; d=json.load(open('$OUT/w2.json')); s=d.get('server_first_token_stages_ms') or {}
print('w2 client ttft %.2f' % d['mean_ttft_ms'], ' '.join(f'{k} {v:.2f}' for k, v in s.items()))"
