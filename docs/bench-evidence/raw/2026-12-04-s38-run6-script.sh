#!/usr/bin/env bash
# session 38 run 6: garbage-collection pauses while serving. W1 and W3 with a --profile-steps window
# (which now times every collection in it), on A = 3e376d9 (.exp/base: engine/ server/ client/
# loadgen/) and B = A + gc.collect(); gc.freeze() in the engine process before it reports ready.
# Then the step profiler's GPU test on B.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc6 DELTASERVE_CUDA_DIR=$PWD/cuda
date -u; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
printf '#!/bin/sh\ncd %s/.exp/base && PYTHONPATH=/tmp/site:%s/.exp/base exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/pyA; chmod +x /tmp/pyA
printf '#!/bin/sh\ncd %s && PYTHONPATH=/tmp/site:%s exec python3 "$@"\n' "$PWD" "$PWD" > /tmp/pyB; chmod +x /tmp/pyB
B="--max-num-batched-tokens 2048 --max-num-seqs"
for side in A B; do
    PY=/tmp/py$side W1_FLAGS="$B 32 --num-gpu-blocks-override 1280 --profile-steps 150:300 --profile-dir /tmp/p-$side-w1" \
    W3_FLAGS="$B 64 --num-gpu-blocks-override 2600 --profile-steps 900:600 --profile-dir /tmp/p-$side-w3" \
    ONLY="w1 w3" timeout 200 deploy/bench-workloads.sh $PWD/.gpu/qwen3.5-4b $PWD/.gpu /tmp/wl-$side > $OUT/wl-$side.txt 2>&1
    echo "$side rc $?"; tail -3 $OUT/wl-$side.txt
    for w in w1 w3; do cp /tmp/p-$side-$w/step-profile.json $OUT/profile-$side-$w.json 2>/dev/null || echo "no profile $side $w"; done
done
grep -h "garbage\|step profile: [0-9]" /tmp/wl-A/server-*.log /tmp/wl-B/server-*.log | cut -c100-330
PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_step_profile_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.txt
