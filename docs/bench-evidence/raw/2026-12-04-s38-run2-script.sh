#!/usr/bin/env bash
# session 38 run 2: interactive load with 768-token prompts (W6) and W4, served by the committed tree
# (A: graphs.mixed up to 512 rows) and by A with MIXED_MAX_TOKENS = 1024 (B, .exp/m1024); each
# server profiles steps 200..1199 of its first W6 run (--profile-steps), then serves W4 and W6 again
# unprofiled (loadgen figures from those runs: the first run's stats include the profiler's pause).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYUNBUFFERED=1 PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc2 DELTASERVE_CUDA_DIR=$PWD/cuda
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
run_tree() {  # $1 = name, $2 = engine root
    local name=$1 root=$2 port=8100
    PYTHONPATH=/tmp/site:$root python3 -m engine.cli serve --model .gpu/qwen3.5-4b --load-format dummy \
        --max-num-batched-tokens 2048 --num-gpu-blocks-override 1280 --port $port \
        --profile-steps 200:1000 --profile-dir /tmp/p-$name > /tmp/server-$name.log 2>&1 &
    local srv=$!
    for _ in $(seq 240); do python3 -c "import sys,urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break; sleep 0.5; done
    grep -h "whole-step graphs" /tmp/server-$name.log | cut -c1-300
    for job in "w6 p" "w4 4" "w6 6"; do
        set -- $job
        PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m loadgen run --dataset .gpu/$1.jsonl --no-progress \
            --request-rate $([ $1 = w6 ] && echo 4 || echo 8) --concurrency 64 --num-warmups 2 \
            --base-url http://127.0.0.1:$port --result-file /tmp/$name-$1-$2.json --label "$1 $name" > /tmp/$name-$1-$2.txt 2>&1 || echo "$name $1: loadgen failed"
    done
    kill -TERM $srv; wait $srv
    cp /tmp/p-$name/step-profile.json $OUT/profile-$name.json 2>/dev/null || echo "no profile for $name"
}
run_tree A $PWD
run_tree B $PWD/.exp/m1024
grep -h "step profile" /tmp/server-*.log | cut -c1-400 > $OUT/profile-lines.txt
(cd /tmp && tar czf $OUT/runs.tgz server-*.log A-*.json B-*.json A-*.txt B-*.txt)
python3 - <<'PY'
import json, glob, os
print(f"{'run':<10}{'done':>5}{'fail':>5}{'dur':>7}{'TTFT':>8}{'p99':>8}{'TPOT':>7}{'ITL p50':>8}{'p99':>8}")
for f in sorted(glob.glob('/tmp/[AB]-w*.json')):
    r = json.load(open(f))
    print(f"{os.path.basename(f)[:-5]:<10}{r['completed']:>5}{r['failed']:>5}{r['duration']:>7.2f}{r['mean_ttft_ms']:>8.1f}{r['p99_ttft_ms']:>8.1f}{r['mean_tpot_ms']:>7.2f}{r['median_itl_ms']:>8.2f}{r['p99_itl_ms']:>8.2f}")
PY
python3 - $OUT <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for w in ("A", "B"):
    p = out / f"profile-{w}.json"
    if not p.is_file():
        continue
    s = json.loads(p.read_text())
    i = s["idle_per_step_ms"]
    print(f"{w}: {s['steps']} steps {s['span_ms']:.1f} ms busy {100*s['busy_fraction']:.1f}% idle/step mean {i['mean']:.3f} p50 {i['p50']:.3f} p90 {i['p90']:.3f} max {i['max']:.3f}")
    for label, k in s["by_kind"].items():
        print(f"  {label:<42}{k['steps']:>5} tok {k['tokens']:>6.0f} span {k['span_ms']:>7.3f} busy {k['busy_ms']:>7.3f} idle {k['idle_ms']:>6.3f} (lead {k['lead_ms']:.3f} inner {k['inner_ms']:.3f} tail {k['tail_ms']:.3f})")
PY
