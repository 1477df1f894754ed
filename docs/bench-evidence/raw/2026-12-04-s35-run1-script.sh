#!/usr/bin/env bash
# session 35 run 1: sample.logprobs kernel: tests, op bench, step A/B, end-to-end scoring A/B
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
git rev-parse --short HEAD; date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 240 python3 -m pytest -q -m gpu tests/ops/test_logprobs.py tests/worker/test_sampling_gpu.py > $OUT/tests.txt 2>&1; echo "tests rc $?"; tail -3 $OUT/tests.txt
timeout 200 python3 -m engine.bench.logprobs > $OUT/bench.txt 2>&1; echo "bench rc $?"
DEF="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise graphs.prefill graphs.mixed"
mkdir -p $OUT/steps
for arm in A B A B; do
  extra=""; [ $arm = B ] && extra="sample.logprobs"
  n=$(ls $OUT/steps | grep -c "^$arm" ); f=$OUT/steps/$arm$((n+1)).txt
  timeout 150 python3 -m engine.bench.steps --model .gpu/qwen3.5-4b --load-format dummy --reps 10 --graph-capture lazy --steps score --kernel-arms $DEF $extra > $f 2>&1
  echo "steps $arm rc $?"; grep -i "score" $f | tail -3
done
CONCURRENCY=1 EXTRA_BODY='{"echo": true, "logprobs": 1}' timeout 330 deploy/ab-arms.sh .gpu/qwen3.5-4b .gpu/w5.jsonl $OUT/ab-w5 "" "$DEF sample.logprobs" 3 > $OUT/ab-w5.txt 2>&1; echo "ab rc $?"
tail -25 $OUT/ab-w5/ab-table.txt
cat $OUT/ab-w5/peak-memory.txt
tail -22 $OUT/bench.txt
(cd $OUT && tar czf steps.tgz steps && rm -rf steps && tar czf ab-w5.tgz ab-w5 && rm -rf ab-w5)
ls $OUT
