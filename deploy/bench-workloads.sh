#!/usr/bin/env bash
# W1, W2 and W3 (docs/BENCHMARKS.md) on one GPU in one call, with device memory sampled by nvidia-smi.
# W1 + W2 run on one server with the W1 flags; W3 on a second server with its KV pool (2,600 blocks).
#
# Usage: deploy/bench-workloads.sh CKPT_4B DATA_DIR OUT_DIR [extra serve flags...]
#   CKPT_4B   checkpoint dir (deltaserve make-checkpoint --preset qwen3.5-4b), served with dummy weights
#   DATA_DIR  w1.jsonl (128 x 1,024 / 128), w2.jsonl (1,024 / 128), w3.jsonl (128 x 256 / 1,024),
#             each from `loadgen pretokenize` (docs/BENCHMARKS.md)
# Env: PY (default python3), PORT (default 8000), ONLY ("w1 w2 w3" by default), W1_FLAGS, W3_FLAGS.
set -uo pipefail
ckpt=$1 data=$2 out=$3
shift 3
PY=${PY:-python3}
PORT=${PORT:-8000}
ONLY=${ONLY:-w1 w2 w3}
W1_FLAGS=${W1_FLAGS:---max-num-batched-tokens 2048 --num-gpu-blocks-override 1280 --max-num-seqs 32}
W3_FLAGS=${W3_FLAGS:---max-num-batched-tokens 2048 --num-gpu-blocks-override 2600 --max-num-seqs 64}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

wait_health() {  # $1 = pid
    for _ in $(seq 300); do
        kill -0 "$1" 2>/dev/null || return 1
        "$PY" -c 'import sys, httpx; sys.exit(httpx.get(sys.argv[1], timeout=1).status_code != 200)' \
            "http://127.0.0.1:$PORT/health" 2>/dev/null && return 0
        sleep 0.5
    done
    return 1
}

# $1 = name, $2 = serve flags (split on purpose), then loadgen runs as "workload:concurrency" words
serve_and_run() {
    local name=$1 flags=$2
    shift 2
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 300 >"$out/smi-$name.txt" &
    local smi=$!
    local t0=$SECONDS
    # shellcheck disable=SC2086
    "$PY" -m engine.cli serve --model "$ckpt" --load-format dummy --port "$PORT" $flags "$@" \
        >"$out/server-$name.log" 2>&1 &
    local srv=$!
    if wait_health "$srv"; then
        echo "$name: healthy after $((SECONDS - t0)) s"
        for job in $RUNS; do
            local w=${job%%:*} c=${job##*:}
            timeout 400 "$PY" -m loadgen run --dataset "$data/$w.jsonl" --concurrency "$c" --num-warmups 2 \
                --no-progress --base-url "http://127.0.0.1:$PORT" --result-file "$out/$w.json" \
                --label "$w $name" >"$out/$w.txt" 2>&1 || echo "$w: loadgen failed"
        done
        "$PY" -c 'import httpx,sys; print(httpx.get(sys.argv[1]).text)' "http://127.0.0.1:$PORT/metrics" \
            | grep -E '^deltaserve_(peak|device|memory|kv|state)' >"$out/metrics-$name.txt"
    else
        echo "$name: server did not become healthy"
        tail -n 30 "$out/server-$name.log"
    fi
    kill -TERM "$srv" 2>/dev/null
    wait "$srv"
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
    echo "$name: nvidia-smi peak $(sort -n "$out/smi-$name.txt" | tail -n 1) MiB"
}

RUNS=""
case " $ONLY " in *" w1 "*) RUNS="w1:32" ;; esac
case " $ONLY " in *" w2 "*) RUNS="$RUNS w2:1" ;; esac
[ -n "$RUNS" ] && serve_and_run w1w2 "$W1_FLAGS" "$@"
RUNS=""
case " $ONLY " in *" w3 "*) RUNS="w3:64" ;; esac
[ -n "$RUNS" ] && serve_and_run w3 "$W3_FLAGS" "$@"

"$PY" - "$out" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print(f"{'run':<4}{'done':>6}{'fail':>6}{'dur s':>9}{'out tok/s':>11}{'TTFT ms':>10}{'TPOT ms':>9}{'ITL p50':>9}")
for w in ("w1", "w2", "w3"):
    p = out / f"{w}.json"
    if not p.is_file():
        continue
    r = json.loads(p.read_text())
    print(f"{w:<4}{r['completed']:>6}{r['failed']:>6}{r['duration']:>9.2f}{r['output_throughput']:>11.0f}"
          f"{r['mean_ttft_ms']:>10.1f}{r['mean_tpot_ms']:>9.2f}{r['median_itl_ms']:>9.2f}")
PYEOF
