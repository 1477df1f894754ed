#!/usr/bin/env bash
# session 33, device run 4: an interactive workload (W4: 100 natural-length ShareGPT prompts, 128
# tokens out, Poisson arrivals at 8/s), defaults (A) vs + graphs.mixed (B), 3 pairs + A/A
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc4
DEF="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise graphs.prefill"
M=.gpu/qwen3.5-4b
echo "== W4 A/B: $(date +%T)"
CONCURRENCY=64 REQUEST_RATE=8 timeout 420 bash deploy/ab-arms.sh $M .gpu/w4.jsonl $OUT/ab4 "" "$DEF graphs.mixed" 3 > $OUT/ab4.txt 2>&1
echo "rc $?"; tail -22 $OUT/ab4.txt
for s in A B; do
  echo "$s: $(grep -h -i 'captured .* whole-step\|engine ready' $OUT/ab4/server-$s.log | cut -c1-60 | head -4 | tr '\n' ' ')"
  python3 - $OUT/ab4/server-$s.log <<'PY'
import json, sys
ts = [json.loads(l)["ts"] for l in open(sys.argv[1]) if l.startswith("{")]
msgs = [json.loads(l)["msg"] for l in open(sys.argv[1]) if l.startswith("{")]
ready = next(t for t, m in zip(ts, msgs) if m.startswith("engine ready"))
print(f"start to engine ready {ready - ts[0]:.1f} s")
PY
done
cd $OUT && tar czf ab4.tgz ab4 && rm -rf ab4
echo "== done: $(date +%T)"
