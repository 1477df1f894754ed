#!/usr/bin/env bash
# GPU acceptance for a deltaserve install on a CUDA host (how the H200 evidence in docs/bench-evidence
# was produced). Runs the GPU test tier, then serves Qwen3.5-4B with dummy weights, checks a streamed
# completion and runs W1 with loadgen, then serves the embedded tiny model on CUDA and streams from it.
#
# Usage: deploy/gpu-acceptance.sh CKPT_4B W1_JSONL OUT_DIR [extra serve flags...]
#   CKPT_4B   a checkpoint dir with config.json + tokenizer (deltaserve make-checkpoint --preset qwen3.5-4b)
#   W1_JSONL  loadgen pretokenize output: 128 x 1,024 prompt tokens, 128 output tokens
#   OUT_DIR   logs, the W1 result JSON, the GPU test report and the per-file GPU test logs land here
# Env: PY (default python3), SKIP_TESTS=1 to skip pytest, PORT (default 8000).
set -uo pipefail
ckpt=$1 w1=$2 out=$3
shift 3
PY=${PY:-python3}
PORT=${PORT:-8000}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 DELTASERVE_GPU_REPORT="$out/gpu-report.jsonl" DELTASERVE_CACHE="$out/cache"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
"$PY" -c 'import torch, cupy; print("torch", torch.__version__, "cuda", torch.version.cuda, "cupy", cupy.__version__)' \
    | tee -a "$out/gpu.txt"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
    # one pytest per file, each under its own limit: the whole tier in one process takes well over the
    # 420 s this script once gave it (docs/bench-evidence/2026-12-03-s32.md, run 5)
    PY="$PY" bash "$(dirname "$0")/gpu-tests.sh" "$out/gpu-tests"
    echo "GPU tests exit status $? (per-file logs and summary.txt in $out/gpu-tests)"
fi

wait_health() {  # $1 = port, $2 = seconds, $3 = server pid (give up at once if it exits)
    for _ in $(seq "$2"); do
        kill -0 "$3" 2>/dev/null || return 1
        "$PY" - "$1" <<'EOF' && return 0
import sys, httpx
try:
    sys.exit(0 if httpx.get(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=1).status_code == 200 else 1)
except Exception:
    sys.exit(1)
EOF
        sleep 1
    done
    return 1
}

echo "== Qwen3.5-4B dummy server"
"$PY" -m engine.cli serve --model "$ckpt" --load-format dummy --max-num-batched-tokens 2048 \
    --num-gpu-blocks-override 1280 --port "$PORT" "$@" >"$out/server-4b.log" 2>&1 &
srv=$!
if wait_health "$PORT" 300 "$srv"; then
    "$PY" -m client "The capital of France is" --max-tokens 16 --stream --base-url "http://127.0.0.1:$PORT" \
        | tee "$out/stream-4b.txt"
    timeout 300 "$PY" -m loadgen run --dataset "$w1" --concurrency 32 --num-warmups 2 --no-progress \
        --base-url "http://127.0.0.1:$PORT" --result-file "$out/w1.json" --label "W1 4B dummy" 2>&1 \
        | tee "$out/w1.txt"
    "$PY" -c 'import httpx,sys; print(httpx.get(sys.argv[1]).text)' "http://127.0.0.1:$PORT/metrics" \
        | grep -E '^deltaserve_(peak|device|kv|state|engine_steps|max_wave)' | tee "$out/metrics-4b.txt"
else
    echo "4B server did not become healthy" | tee -a "$out/server-4b.log"
fi
kill -TERM "$srv" 2>/dev/null
wait "$srv"
echo "4B server exit code $?"

echo "== tiny model on CUDA"
"$PY" -m engine.cli serve --port "$((PORT + 1))" >"$out/server-tiny.log" 2>&1 &
srv=$!
if wait_health "$((PORT + 1))" 120 "$srv"; then
    "$PY" -m client "Hello, how are you?" --max-tokens 24 --stream --base-url "http://127.0.0.1:$((PORT + 1))" \
        | tee "$out/stream-tiny.txt"
fi
kill -TERM "$srv" 2>/dev/null
wait "$srv"
echo "tiny server exit code $?"
