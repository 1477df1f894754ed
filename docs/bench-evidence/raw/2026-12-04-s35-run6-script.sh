#!/usr/bin/env bash
# session 35 run 6: W3 A/B, A = f661ac9 (the session's start, .base) vs B = the final tree, 2 pairs + A/A
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc6
date -u
CONCURRENCY=64 PY_A=.exp/py-base.sh timeout 540 deploy/ab-arms.sh $PWD/.gpu/qwen3.5-4b $PWD/.gpu/w3.jsonl $OUT/ab-w3 "" "" 2 \
  --num-gpu-blocks-override 2600 --max-num-seqs 64 > $OUT/ab-w3.txt 2>&1
echo "ab rc $?"; cat $OUT/ab-w3/ab-table.txt | head -14
python3 - <<'PY'
import json, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/ab-w3/run-*.json")):
    d = json.load(open(f))
    print(os.path.basename(f), round(d["duration"], 2), round(d["mean_ttft_ms"], 1), round(d["mean_tpot_ms"], 3), round(d["median_itl_ms"], 2), d["failed"])
PY
(cd $OUT && tar czf ab-w3.tgz ab-w3 && rm -rf ab-w3)
