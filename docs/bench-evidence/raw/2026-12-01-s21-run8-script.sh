#!/usr/bin/env bash
# session 21, device run 8: the step bench with the idle split (before / between / after the kernels),
# then a host profile of the prefill and mixed launches.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
tar -xzf .gpu/kcache.tgz -C /tmp 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
S="import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])"
timeout 130 python3 -c "$S" --model $M --load-format dummy --reps 10 > $OUT/steps.txt 2>&1
grep -A20 "^step " $OUT/steps.txt | cut -c1-130; tail -2 $OUT/steps.txt | cut -c1-200
timeout 130 python3 -c "$S" --model $M --load-format dummy --reps 5 --steps prefill mixed --host-profile 25 > $OUT/host-profile.txt 2>&1
grep -E "synchronising|host profile" $OUT/host-profile.txt | cut -c1-200
grep -A30 "prefill 2 x 1024: host profile of 5 launches (tottime" $OUT/host-profile.txt | cut -c1-160 | head -34
