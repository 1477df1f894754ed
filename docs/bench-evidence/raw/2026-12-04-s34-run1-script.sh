#!/usr/bin/env bash
# session 34, device run 1: cc71e92 (a lone scored prompt replays its whole-step graph; lone
# unsampled chunks too): the GPU tests it touches, the step bench's score kind without (A) and with
# (B, the defaults) the whole-step graphs, alternated A B A B, then W1, W2, W3 on the defaults
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
export DELTASERVE_GPU_REPORT=$OUT/report.jsonl
DEF="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
echo "== tests: $(date +%T)"
PER_FILE_TIMEOUT=150 timeout 330 bash deploy/gpu-tests.sh /tmp/gt tests/model/test_prefill_graphs_gpu.py \
  tests/model/test_small_model_gpu.py tests/worker/test_memory.py
echo "exit $?"; cp /tmp/gt/summary.txt $OUT/tests-summary.txt
grep -h "FAILED\|Error\|assert" /tmp/gt/*.log | head -8
mkdir -p /tmp/steps
for r in A1 B1 A2 B2; do
  arms=$DEF; case $r in B*) arms="$DEF graphs.prefill graphs.mixed";; esac
  echo "== steps $r: $(date +%T)"
  timeout 60 python3 -m engine.bench.steps --model .gpu/qwen3.5-4b --load-format dummy --reps 10 \
    --graph-capture lazy --steps score --kernel-arms $arms > /tmp/steps/steps-$r.txt 2>&1
  echo "rc $?"; grep -A3 "^step " /tmp/steps/steps-$r.txt | cut -c1-110 | head -4
done
tar czf $OUT/steps.tgz -C /tmp steps
echo "== workloads: $(date +%T)"
timeout 240 bash deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu /tmp/all > $OUT/final.txt 2>&1
tar czf $OUT/workloads.tgz -C /tmp all
grep -E "healthy|smi peak|failed|^w[123] " $OUT/final.txt
echo "== end: $(date +%T)"
