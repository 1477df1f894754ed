#!/usr/bin/env bash
# session 30, device run 3: K4's roundings paired too: GPU tests; bits and per-call times A B B A
# (A = .base = e996c2d, B = this tree); steps (prefill, decode) A B C C B A with C = this tree plus
# conv.vec4 (A/B: the paired roundings; B/C: the arm).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache
R=$PWD/docs/bench-evidence/raw M=$PWD/.gpu/qwen3.5-4b
A() { (cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA timeout ${TO:-60} python3 "$@"); }
B() { PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB timeout ${TO:-60} python3 "$@"; }
C() { B "$@"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== tests: $(date +%T)"
TO=200 B -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_argmax.py tests/ops/test_conv.py \
  tests/ops/test_gdn_decode.py tests/model/test_piecewise_gpu.py tests/model/test_model_gpu.py > $OUT/tests.txt 2>&1
tail -1 $OUT/tests.txt; grep -E "FAILED|ERROR" $OUT/tests.txt | head
echo "== bits + time: $(date +%T)"
for r in 1-A 2-B 3-B 4-A; do
  echo "-- $r" >> $OUT/kernels.txt
  TO=90 ${r#*-} $R/2026-12-02-s30-bits-time.py 2>&1 | grep -v -i warn | grep -v "launch(" >> $OUT/kernels.txt
done
grep digest $OUT/kernels.txt | sort | uniq -c | awk '{print $1, $2, $3, $4, $5, $6, $7}'
grep -v digest $OUT/kernels.txt
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for r in 1-A 2-B 3-C 4-C 5-B 6-A; do
  echo "== steps $r: $(date +%T)"
  arms=$DEF; [ ${r#*-} = C ] && arms="$DEF conv.vec4"
  TO=90 ${r#*-} -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
     --steps prefill decode --kernel-arms $arms > $OUT/steps-$r.txt 2>&1
  grep -E "^prefill|^decode b32|^decode b1 " $OUT/steps-$r.txt | grep -v costliest | head -4 | cut -c1-150
done
