#!/usr/bin/env bash
# session 31, device run 3. A = .base = the committed tree (cd53982: graphs.prefill and the two-row gated
# norm on by default): GPU tests (prefill graphs, the 4B under a 16 GiB budget with the default arms, the
# 4B greedy check left out for time: the model-level paths are bit-identical to session 30's); prefill / mixed / decode steps; W1, W2, W3
# (deploy/bench-workloads.sh). Then B = the working tree (the attention grid with the query tile
# fastest): bits against A (s28-bitwise), per-call times A B B A (s28-attn-time).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) 2>/dev/null
export PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache
R=$PWD/docs/bench-evidence/raw M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
A() { (cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA timeout ${TO:-60} python3 "$@"); }
B() { PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccB timeout ${TO:-60} python3 "$@"; }
DEF="conv.chunk8 conv.k4 conv.vec4 decode.fused prefill.tensorcore prefill.split norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl graphs.piecewise graphs.prefill"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== tests (A): $(date +%T)"
TO=200 A -m pytest -v -s -p no:cacheprovider tests/model/test_prefill_graphs_gpu.py \
  tests/worker/test_memory.py::test_4b_serves_w1_shaped_traffic_under_16gib > $OUT/tests.txt 2>&1
grep -E "PASSED|FAILED|ERROR|slots" $OUT/tests.txt | cut -c1-300; tail -1 $OUT/tests.txt
echo "== steps (A): $(date +%T)"
TO=110 A -m engine.bench.steps --model $M --load-format dummy --reps 20 --graph-capture lazy \
  --steps prefill mixed decode --kernel-arms $DEF > $OUT/steps.txt 2>&1
grep -A18 "^step " $OUT/steps.txt | cut -c1-150
echo "== workloads (A): $(date +%T)"
(cd .base && PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ccA timeout 230 bash deploy/bench-workloads.sh $M $D /tmp/all) > $OUT/final.txt 2>&1
cp /tmp/all/w1.json /tmp/all/w2.json /tmp/all/w3.json $OUT/ 2>/dev/null
grep -E "healthy|smi peak|failed|^w[123] " $OUT/final.txt
for w in w1 w2 w3; do python3 -c "
import json; d=json.load(open('$OUT/$w.json'))
st=d.get('server_first_token_stages_ms') or {}
print('$w', 'dur', round(d['duration'],2), 'client ttft', round(d['mean_ttft_ms'],2), 'p99', round(d['p99_ttft_ms'],2), 'tpot', round(d['mean_tpot_ms'],2), 'failed', d['failed'])
print('   server', ' '.join(f'{k} {v:.2f}' for k, v in st.items()))"; done
echo "== attention grid (B): $(date +%T)"
A $R/2026-12-02-s28-bitwise.py save /tmp/before.pt > $OUT/attn.txt 2>&1
B $R/2026-12-02-s28-bitwise.py compare /tmp/before.pt >> $OUT/attn.txt 2>&1
tail -1 $OUT/attn.txt; grep DIFFERS $OUT/attn.txt | head -5
for r in 1-A 2-B 3-B 4-A; do
  echo "-- attn time $r" >> $OUT/attn.txt
  TO=45 ${r#*-} $R/2026-12-02-s28-attn-time.py 2>&1 | grep -v Warning >> $OUT/attn.txt
done
grep -A20 "attn time" $OUT/attn.txt | grep -E "attn time|prefill|mixed|decode b32"
echo "== end: $(date +%T)"
