#!/usr/bin/env bash
# session 21, device run 6: the step bench on the on-demand tree (twice, for its spread), then the
# attention decode sweep (tile shapes x split counts) for the 75%-of-copy target at batch 32.
set -u
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
for i in 1 2; do
  timeout 120 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" --model $M --load-format dummy --reps 10 > $OUT/steps-$i.txt 2>&1
  grep -A8 "^step " $OUT/steps-$i.txt
done
timeout 150 python3 -m engine.bench.attention --skip prefill --sweep > $OUT/attn-sweep.txt 2>&1
grep -E "b32|b64" $OUT/attn-sweep.txt | sort -t: -k2 -n | head -40 | cut -c1-160
