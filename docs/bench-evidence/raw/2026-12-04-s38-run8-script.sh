#!/usr/bin/env bash
# session 38 run 8: the step profiler's GPU test on the per-kind families, then W1 profiled (its step
# kinds' device time by op family)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc8
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_step_profile_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.txt
W1_FLAGS="--max-num-batched-tokens 2048 --max-num-seqs 32 --num-gpu-blocks-override 1280 --profile-steps 150:300 --profile-dir /tmp/p-w1" \
ONLY="w1" timeout 150 deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu /tmp/wl > $OUT/wl.txt 2>&1
echo "w1 rc $?"
cp /tmp/p-w1/step-profile.json $OUT/profile-w1.json
grep -h "step profile" /tmp/wl/server-*.log | cut -c100-400
python3 - $OUT/profile-w1.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for label, k in s["by_kind"].items():
    fam = ", ".join(f"{f} {ms:.3f}" for f, ms in k["families_ms"].items())
    print(f"{label}: {k['steps']} steps, busy {k['busy_ms']:.3f} ms: {fam}")
PY
