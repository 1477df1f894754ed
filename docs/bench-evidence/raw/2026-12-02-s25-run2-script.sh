#!/usr/bin/env bash
# session 25, device run 2: (1) the prefill attention shapes (the step shapes 1 x 1,024 and 2 x 1,024
# beside 32 x 1,024 and the mixed batch) with forced KV splits 1-4: does splitting the KV walk balance
# a single sequence's causal tiles? (2) engine.bench.whole (back to back vs rested) with nvidia-smi
# sampling SM clock, power and the clock-event reasons every 50 ms: is the slower back-to-back device
# its clock?
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
nvidia-smi --query-gpu=name,power.limit,enforced.power.limit,power.default_limit,power.max_limit,clocks.max.sm,clocks.applications.graphics \
    --format=csv > $OUT/limits.txt 2>&1
cat $OUT/limits.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 50 > $OUT/smi.csv 2>&1 &
SMI=$!
phase() { echo "$(date +%H:%M:%S.%N | cut -c1-12) $1" >> $OUT/phases.txt; }
phase "attention start"
timeout 200 python3 -m engine.bench.attention --skip decode --sweep > $OUT/attention.txt 2>&1
phase "attention end"
grep -E "^\| prefill|^measured|sweep" $OUT/attention.txt | cut -c1-140
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
phase "whole start"
timeout 240 python3 -m engine.bench.whole --model $M --load-format dummy --kernel-arms $DEF --reps 20 > $OUT/whole.txt 2>&1
phase "whole end"
grep -v "Warning\|setter\|launch(\|_warn_once" $OUT/whole.txt | tail -14
sleep 0.3; kill $SMI
cat $OUT/phases.txt
echo "== smi: $(wc -l < $OUT/smi.csv) samples; SM clock MHz (count) during whole:"
awk -F', ' '{print $2, $5}' $OUT/smi.csv | sort | uniq -c | sort -rn | head -12
