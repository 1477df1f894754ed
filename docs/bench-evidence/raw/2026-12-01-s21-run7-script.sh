#!/usr/bin/env bash
# session 21, device run 7: the step bench on the on-demand tree, twice (its spread).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
for i in 1 2; do
  timeout 130 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" --model $M --load-format dummy --reps 10 > $OUT/steps-$i.txt 2>&1
  grep -A8 "^step " $OUT/steps-$i.txt; tail -2 $OUT/steps-$i.txt | cut -c1-200
done
