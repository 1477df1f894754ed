#!/usr/bin/env bash
# session 28, device run 2: prefill and mixed steps, default arms, A B B A (A = .base = 9f8bbbf, B = this
# tree); the attention kernel with two partial sums in S = Q K^T at 32-key tiles (.exp: CH = 2 for
# BN <= 32) against this tree, B E E B; the attention bench on this tree (fractions of the measured
# copy bandwidth and matmul rate, with the lazy rescale rows); the GDN split path's prep pass alone, A B.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache
R=$PWD/docs/bench-evidence/raw M=$PWD/.gpu/qwen3.5-4b
A() { (cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA timeout ${TO:-120} python3 "$@"); }
B() { PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB timeout ${TO:-120} python3 "$@"; }
E() { (cd .exp && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccE timeout ${TO:-120} python3 "$@"); }
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for r in 1-A 2-B 3-B 4-A; do
  echo "== steps $r: $(date +%T)"
  ${r#*-} -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
     --steps prefill mixed --kernel-arms $DEF > $OUT/steps-$r.txt 2>&1
  grep -E "^prefill|^mixed" $OUT/steps-$r.txt | head -4 | cut -c1-140
done
for r in 1-B 2-E 3-E 4-B; do
  echo "== time $r: $(date +%T)"
  TO=60 ${r#*-} $R/2026-12-02-s28-attn-time.py lazy 2>&1 | grep -v Warning > $OUT/time-$r.txt
  grep -E "b32|prefill|mixed" $OUT/time-$r.txt
done
echo "== attention bench: $(date +%T)"
TO=150 B -m engine.bench.attention > $OUT/attention.txt 2>&1
grep -E "^\||^measured" $OUT/attention.txt | cut -c1-150
for r in 1-A 2-B; do
  echo "== prep pass $r: $(date +%T)"
  TO=45 ${r#*-} -m engine.bench.chunk --split-parts 2>&1 | grep -E "prep pass" > $OUT/parts-$r.txt
  cat $OUT/parts-$r.txt
done
