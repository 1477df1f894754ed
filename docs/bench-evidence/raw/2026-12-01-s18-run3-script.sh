#!/usr/bin/env bash
# session 18, device run 3: end-to-end A/B of graphs.piecewise. 1) deploy/ab-arms.sh W1, A = the
# defaults, B = defaults + graphs.piecewise, 3 alternated pairs + A/A; 2) W1, W2, W3 for B then A
# (bench-workloads.sh, one fresh server each, same kernel cache).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc1
M=$PWD/.gpu/qwen3.5-4b D=$PWD/.gpu
DEF="conv.chunk8 conv.k4 decode.fused prefill.tensorcore norm.fused attention.qk_fused attention.paged linear.skinny graphs.pdl"
PW="$DEF graphs.piecewise"
timeout 330 bash deploy/ab-arms.sh $M $D/w1.jsonl /tmp/ab "" "$PW" 3 --max-num-seqs 32 > $OUT/ab.txt 2>&1
grep -h "healthy\|piecewise graphs\|device memory:" /tmp/ab/server-*.log | cut -c1-330 >> $OUT/ab.txt
cp /tmp/ab/ab.json $OUT/ 2>/dev/null
wl() {
  W1_FLAGS="--max-num-batched-tokens 2048 --num-gpu-blocks-override 1280 --max-num-seqs 32 $2" \
  W3_FLAGS="--max-num-batched-tokens 2048 --num-gpu-blocks-override 2600 --max-num-seqs 64 $2" \
    timeout 250 bash deploy/bench-workloads.sh $M $D /tmp/$1 > $OUT/wl-$1.txt 2>&1
  grep -h "piecewise graphs\|device memory:" /tmp/$1/server-*.log | cut -c1-330 >> $OUT/wl-$1.txt
  cp /tmp/$1/w1.json $OUT/w1-$1.json 2>/dev/null
}
wl B "--kernel-arms $PW"
wl A ""
cat $OUT/ab.txt | grep -v "^WARNING" | tail -40
for x in B A; do echo "== $x"; grep -E "^w[123] |healthy|smi peak|^run" $OUT/wl-$x.txt; done
