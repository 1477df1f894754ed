#!/usr/bin/env bash
# session 38 run 1: the step profiler's GPU test, then W1, W3 and W2 served with --profile-steps windows
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
date -u; git log --oneline -1; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_step_profile_gpu.py tests/worker/test_async_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -3 $OUT/tests.txt
B="--max-num-batched-tokens 2048 --max-num-seqs"
W1_FLAGS="$B 32 --num-gpu-blocks-override 1280 --profile-steps 150:300 --profile-dir /tmp/p-w1" \
W3_FLAGS="$B 64 --num-gpu-blocks-override 2600 --profile-steps 900:300 --profile-dir /tmp/p-w3" \
ONLY="w1 w3" timeout 260 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu /tmp/wl13 > $OUT/wl13.txt 2>&1
echo "w1 w3 rc $?"; tail -4 $OUT/wl13.txt
W1_FLAGS="$B 32 --num-gpu-blocks-override 1280 --profile-steps 300:600 --profile-dir /tmp/p-w2" \
ONLY="w2" timeout 200 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu /tmp/wl2 > $OUT/wl2.txt 2>&1
echo "w2 rc $?"; tail -3 $OUT/wl2.txt
for w in w1 w3 w2; do cp /tmp/p-$w/step-profile.json $OUT/profile-$w.json 2>/dev/null || echo "no profile for $w"; ls -la /tmp/p-$w 2>/dev/null | tail -2; done
grep -h "step profile" /tmp/wl13/server-*.log /tmp/wl2/server-*.log | cut -c1-400 > $OUT/profile-lines.txt
(cd /tmp && tar czf $OUT/logs.tgz wl13/*.log wl13/*.txt wl2/*.log wl2/*.txt wl13/*.json wl2/*.json)
python3 - $OUT <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for w in ("w1", "w3", "w2"):
    p = out / f"profile-{w}.json"
    if not p.is_file():
        continue
    s = json.loads(p.read_text())
    i = s["idle_per_step_ms"]
    print(f"{w}: {s['steps']} steps {s['span_ms']:.1f} ms busy {100*s['busy_fraction']:.1f}% idle/step mean {i['mean']:.3f} p50 {i['p50']:.3f} p90 {i['p90']:.3f} max {i['max']:.3f}")
    for label, k in s["by_kind"].items():
        print(f"  {label:<42}{k['steps']:>5} tok {k['tokens']:>6.0f} span {k['span_ms']:>7.3f} busy {k['busy_ms']:>7.3f} idle {k['idle_ms']:>6.3f} (lead {k['lead_ms']:.3f} inner {k['inner_ms']:.3f} tail {k['tail_ms']:.3f})")
PY
