#!/usr/bin/env bash
# session 35 run 3: K4 without the NVRTC spill (z in shared memory): CuPy's NVRTC options; decode tests; K4 A/B
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3 DELTASERVE_GPU_REPORT=$OUT/report.jsonl
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 .exp/cupy_opts.py 2>&1 | tail -3
PER_FILE_TIMEOUT=200 timeout 300 deploy/gpu-tests.sh $OUT/tests tests/ops/test_gdn_decode.py tests/model/test_small_model_gpu.py > $OUT/tests.txt 2>&1
echo "tests rc $?"; cat $OUT/tests/summary.txt
for arm in A B A B; do
  n=$(ls $OUT | grep -c "^dec-$arm"); f=$OUT/dec-$arm$((n+1)).txt
  if [ $arm = A ]; then timeout 120 .exp/py-base.sh -m engine.bench.decode > $f 2>&1; else timeout 120 python3 -m engine.bench.decode > $f 2>&1; fi
  echo "decode $arm rc $?"; grep -E "regs|B=(1|8|32|64): fused" $f
done
(cd $OUT && tar czf tests.tgz tests && rm -rf tests && tar czf dec.tgz dec-* && rm -f dec-*)
