#!/usr/bin/env bash
# session 29, device run 2: the fixed out= test; then decode (b1 / 8 / 32 / 64) and mixed steps, default
# arms, A B B A (A = .base = 232b644, session 28's tree; B = this tree: raw bf16 logits, greedy argmax on
# them); run 2-B also lists each step's costliest kernels.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache
M=$PWD/.gpu/qwen3.5-4b
A() { (cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA timeout ${TO:-120} python3 "$@"); }
B() { PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB timeout ${TO:-120} python3 "$@"; }
TO=90 B -m pytest -v -p no:cacheprovider tests/ops/test_gemm.py -k "out_takes or graph_replay" > $OUT/tests.txt 2>&1
grep -E "PASSED|FAILED|ERROR" $OUT/tests.txt | cut -c1-120; tail -1 $OUT/tests.txt
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for r in 1-A 2-B 3-B 4-A; do
  echo "== steps $r: $(date +%T)"
  top=""; [ $r = 2-B ] && top="--top 20"
  TO=130 ${r#*-} -m engine.bench.steps --model $M --load-format dummy --reps 30 --graph-capture lazy \
     --steps decode mixed $top --kernel-arms $DEF > $OUT/steps-$r.txt 2>&1
  grep -E "^decode|^mixed" $OUT/steps-$r.txt | grep -v costliest | head -5 | cut -c1-150
done
