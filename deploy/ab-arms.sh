#!/usr/bin/env bash
# End-to-end, order-alternated A/B of two kernel-arm sets (docs/kernels.md "Arms": an arm becomes a
# default only if it wins here), on one GPU: both servers stay up side by side (two Qwen3.5-4B dummy
# servers take ~50 GB), so no run pays a server start, and `loadgen ab` alternates A B, B A, ... then an A/A pair for noise.
#
# Usage: deploy/ab-arms.sh CKPT_4B W1_JSONL OUT_DIR "ARMS_A" "ARMS_B" [PAIRS] [extra serve flags...]
#   ARMS_*  space-separated arm names for --kernel-arms ("" = the defaults), e.g. "conv.chunk8 conv.k4 conv.vec4"
#   PAIRS   alternated A/B pairs before the A/A pair (default 2)
# Env: PY (default python3), PORT_A/PORT_B (8001/8002), CONCURRENCY (default 32, W1's; 1 for W2),
#   REQUEST_RATE: requests per second, Poisson arrivals (open loop, capped at CONCURRENCY in flight),
#   FLAGS_A/FLAGS_B: serve flags for one side only (A/B a server flag with equal arms, e.g.
#   FLAGS_B="--gdn-state-memory upfront"); PY_A/PY_B: the Python command of one side only (default
#   PY), e.g. a wrapper that runs an older checkout, to A/B two trees with equal arms and flags;
#   EXTRA_BODY: a JSON object merged into every request (loadgen --extra-body), e.g. '{"echo": true,
#   "logprobs": 1}' for prompt scoring as lm-eval's loglikelihood requests do.
# Output: OUT_DIR/ab.json (per-metric B/A ratios and the A/A band), run-*.json, server logs, and
# peak-memory.txt: each server's peak device-memory gauge after all its runs. The servers persist
# across runs, so loadgen leaves their (cumulative) peak out of ab.json's ratios; the gauge is
# device-wide, so with both servers on one GPU even the final values count both.
set -uo pipefail
ckpt=$1 w1=$2 out=$3 arms_a=$4 arms_b=$5 pairs=${6:-2}
shift $(($# < 6 ? $# : 6))
PY=${PY:-python3}
PORT_A=${PORT_A:-8001}
PORT_B=${PORT_B:-8002}
CONCURRENCY=${CONCURRENCY:-32}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

serve() {  # $1 = python, $2 = port, $3 = arms, $4 = log, then extra serve flags; prints the pid
    local py=$1 port=$2 arms=$3 log=$4
    shift 4
    # shellcheck disable=SC2086  # the arm list is meant to split into words
    "$py" -m engine.cli serve --model "$ckpt" --load-format dummy --max-num-batched-tokens 2048 \
        --num-gpu-blocks-override 1280 --port "$port" ${arms:+--kernel-arms $arms} "$@" >"$log" 2>&1 &
    echo $!
}

wait_health() {  # $1 = port, $2 = seconds, $3 = pid
    for _ in $(seq "$2"); do
        kill -0 "$3" 2>/dev/null || return 1
        "$PY" -c 'import sys, httpx; sys.exit(httpx.get(sys.argv[1], timeout=1).status_code != 200)' \
            "http://127.0.0.1:$1/health" 2>/dev/null && return 0
        sleep 1
    done
    return 1
}

# shellcheck disable=SC2086  # the one-side flags are meant to split into words
a=$(serve "${PY_A:-$PY}" "$PORT_A" "$arms_a" "$out/server-A.log" ${FLAGS_A:-} "$@")
# shellcheck disable=SC2086
b=$(serve "${PY_B:-$PY}" "$PORT_B" "$arms_b" "$out/server-B.log" ${FLAGS_B:-} "$@")
trap 'kill -TERM "$a" "$b" 2>/dev/null; wait "$a" "$b" 2>/dev/null' EXIT
if ! wait_health "$PORT_A" 400 "$a" || ! wait_health "$PORT_B" 400 "$b"; then
    echo "a server did not become healthy; see $out/server-*.log" >&2
    tail -n 20 "$out"/server-*.log >&2
    exit 1
fi
echo "A: ${PY_A:-$PY} --kernel-arms ${arms_a:-(defaults)} ${FLAGS_A:-}   B: ${PY_B:-$PY} --kernel-arms ${arms_b:-(defaults)} ${FLAGS_B:-}" \
    | tee "$out/arms.txt"
"$PY" -m loadgen ab --a-url "http://127.0.0.1:$PORT_A" --b-url "http://127.0.0.1:$PORT_B" --pairs "$pairs" \
    --dataset "$w1" --concurrency "$CONCURRENCY" ${REQUEST_RATE:+--request-rate "$REQUEST_RATE"} ${EXTRA_BODY:+--extra-body "$EXTRA_BODY"} --num-warmups 2 --no-progress --out-dir "$out" 2>"$out/ab.log" \
    | tee "$out/ab-table.txt"
rc=${PIPESTATUS[0]}
for arm in A B; do
    port=$PORT_A
    [ "$arm" = B ] && port=$PORT_B
    "$PY" -c 'import httpx, sys; print(httpx.get(sys.argv[1]).text)' "http://127.0.0.1:$port/metrics" \
        | grep -E '^deltaserve_peak_device_memory_bytes' | sed "s/^/$arm /"
done | tee "$out/peak-memory.txt"
exit "$rc"
