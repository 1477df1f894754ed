#!/usr/bin/env bash
# session 30, device run 2: bf16 roundings paired (conv prefill, gated norm, attention gate): GPU tests
# of the touched kernels and the argmax; bits and per-call times A B B A (A = .base = e996c2d, B = this
# tree); the attention's bits (s28-bitwise) and times (s28-attn-time); prefill and mixed steps A B B A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache
R=$PWD/docs/bench-evidence/raw M=$PWD/.gpu/qwen3.5-4b
A() { (cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA timeout ${TO:-60} python3 "$@"); }
B() { PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB timeout ${TO:-60} python3 "$@"; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== tests: $(date +%T)"
TO=240 B -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_argmax.py tests/ops/test_conv.py tests/ops/test_norm.py \
  tests/ops/test_gdn_decode.py tests/ops/test_attention_cuda.py > $OUT/tests.txt 2>&1
tail -1 $OUT/tests.txt; grep -E "FAILED|ERROR" $OUT/tests.txt | head
echo "== bits + time: $(date +%T)"
for r in 1-A 2-B 3-B 4-A; do
  echo "-- $r" >> $OUT/kernels.txt
  TO=90 ${r#*-} $R/2026-12-02-s30-bits-time.py 2>&1 | grep -v Warn >> $OUT/kernels.txt
done
grep digest $OUT/kernels.txt | sort | uniq -c | awk '{print $1, $2, $3, $4, $5, $6}'
grep -v digest $OUT/kernels.txt
echo "== attention bits: $(date +%T)"
A $R/2026-12-02-s28-bitwise.py save /tmp/before.pt > $OUT/attn.txt 2>&1
B $R/2026-12-02-s28-bitwise.py compare /tmp/before.pt >> $OUT/attn.txt 2>&1
tail -1 $OUT/attn.txt; grep DIFFERS $OUT/attn.txt | head
for r in 1-A 2-B 3-B 4-A; do
  echo "-- attn time $r" >> $OUT/attn.txt
  TO=45 ${r#*-} $R/2026-12-02-s28-attn-time.py 2>&1 | grep -v Warning >> $OUT/attn.txt
done
grep -A20 "attn time" $OUT/attn.txt | grep -E "attn time|prefill|mixed|decode b32"
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise"
for r in 1-A 2-B 3-B 4-A; do
  echo "== steps $r: $(date +%T)"
  top=""; [ $r = 2-B ] && top="--top 25"
  TO=90 ${r#*-} -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
     --steps prefill mixed $top --kernel-arms $DEF > $OUT/steps-$r.txt 2>&1
  grep -E "^prefill|^mixed" $OUT/steps-$r.txt | grep -v costliest | head -3 | cut -c1-150
done
