#!/usr/bin/env bash
# session 38 run 7: long prompts (8k / 16k / 32k tokens, 16 out, concurrency 1) on the final tree:
# TTFT, and one 32k prompt's steps profiled (--profile-steps) for where its prefill time goes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc7
date -u; git log --oneline -1; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python3 -m engine.cli serve --model .gpu/qwen3.5-4b --load-format dummy --max-num-batched-tokens 2048 \
    --num-gpu-blocks-override 1280 --max-num-seqs 32 --port 8200 \
    --profile-steps 31:31 --profile-dir /tmp/p-long > /tmp/server-long.log 2>&1 &
srv=$!
for _ in $(seq 240); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8200/health', timeout=1)" 2>/dev/null && break; sleep 0.5; done
run() {  # $1 dataset, $2 prompts, $3 warmups, $4 name
    timeout 120 python3 -m loadgen run --dataset .gpu/$1.jsonl --num-prompts $2 --num-warmups $3 --concurrency 1 \
        --no-progress --base-url http://127.0.0.1:8200 --result-file /tmp/$4.json --label $4 > /tmp/$4.txt 2>&1 || echo "$4 failed"
}
run long32000 1 1 profiled32k
run long32000 3 0 l32k
run long16000 3 1 l16k
run long8000 3 1 l8k
run w2 3 1 l1k
kill -TERM $srv; wait $srv
grep -h "step profile" /tmp/server-long.log | cut -c100-360
cp /tmp/p-long/step-profile.json $OUT/profile-long32k.json 2>/dev/null || echo "no profile"
cp /tmp/server-long.log $OUT/server.log
python3 - <<'PY'
import json
print(f"{'run':<12}{'done':>5}{'fail':>5}{'TTFT mean':>10}{'median':>9}{'TPOT':>8}")
for n in ("l1k", "l8k", "l16k", "l32k", "profiled32k"):
    try:
        r = json.load(open(f"/tmp/{n}.json"))
    except OSError:
        continue
    print(f"{n:<12}{r['completed']:>5}{r['failed']:>5}{r['mean_ttft_ms']:>10.1f}{r['median_ttft_ms']:>9.1f}{r['mean_tpot_ms']:>8.2f}")
    json.dump({k: v for k, v in r.items() if not isinstance(v, list)}, open(f"{__import__('os').environ['OUT']}/{n}.json", "w"), indent=1)
PY
