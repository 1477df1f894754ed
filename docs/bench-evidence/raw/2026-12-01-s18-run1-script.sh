#!/usr/bin/env bash
# session 18, device run 1: piecewise graphs (arm graphs.piecewise): GPU tests, then the step bench
# with the default arms (A) and with graphs.piecewise added (B).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader > $OUT/gpu.txt
timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/worker/test_piecewise.py tests/model/test_piecewise_gpu.py \
  "tests/model/test_small_model_gpu.py" -k "piecewise or no_kernel or decode_graph" > $OUT/tests.txt 2>&1
tail -5 $OUT/tests.txt
grep -E "piecewise|no_live" /tmp/deltaserve-gpu-report.jsonl
steps() {
  timeout 200 python3 -c "import logging,sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); from engine.bench.steps import main; main(sys.argv[1:])" \
    --model $M --load-format dummy --reps 10 --kernel-arms $2 > $OUT/steps-$1.txt 2>&1
  echo "== $1"; grep -E "captured|piecewise graphs|device memory" $OUT/steps-$1.txt | cut -c1-300; grep -A12 "^step " $OUT/steps-$1.txt
}
steps A "$DEF"
steps B "$DEF graphs.piecewise"
