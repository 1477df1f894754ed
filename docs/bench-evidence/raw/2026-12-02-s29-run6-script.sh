#!/usr/bin/env bash
# session 29, device run 6: the gated RMSNorm taking four rows per warp on long steps and the qk norm /
# RoPE / KV-write kernel taking several row blocks per CTA (its token's cos / sin once): their GPU tests
# and the 4B greedy check; per call A B B A with output digests (A = .base = fb16d71, the kernels before);
# prefill steps A B B A, then this tree with conv.vec4 twice (C).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache
R=$PWD/docs/bench-evidence/raw M=$PWD/.gpu/qwen3.5-4b
A() { (cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA timeout ${TO:-60} python3 "$@"); }
B() { PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB timeout ${TO:-60} python3 "$@"; }
echo "== tests: $(date +%T)"
TO=150 B -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_norm.py tests/ops/test_fused.py \
  tests/model/test_model_gpu.py::test_cuda_kernels_match_torch_reference_end_to_end > $OUT/tests.txt 2>&1
tail -2 $OUT/tests.txt
if ! grep -q " passed" $OUT/tests.txt || grep -qE "[0-9]+ (failed|error)" $OUT/tests.txt; then
  echo "tests failed: stopping"; grep -E "FAILED|Error|assert" $OUT/tests.txt | head -30; exit 1; fi
for r in 1-A 2-B 3-B 4-A; do
  echo "== time $r: $(date +%T)"
  TO=60 ${r#*-} $R/2026-12-02-s29-norm-time.py 2>&1 | grep -v Warning > /tmp/time-$r.txt
  cat /tmp/time-$r.txt; { echo "== time $r"; cat /tmp/time-$r.txt; } >> $OUT/time.txt
done
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for r in 1-A 2-B 3-B 4-A 5-C 6-C; do
  echo "== steps $r: $(date +%T)"
  side=${r#*-}; extra=""; [ $side = C ] && side=B && extra="conv.vec4"
  TO=50 $side -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
     --steps prefill --kernel-arms $DEF $extra > /tmp/steps-$r.txt 2>&1
  grep -E "^prefill" /tmp/steps-$r.txt | head -2 | cut -c1-140
  { echo "== steps $r"; grep -v "Warning\|setter(\|_warn_once\|launch(kernel" /tmp/steps-$r.txt; } >> $OUT/steps.txt
done
