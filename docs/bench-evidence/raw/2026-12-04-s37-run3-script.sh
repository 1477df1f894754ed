#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc3
run_ws() { if [ "$1" = unset ]; then timeout 120 python3 .exp/s37/ws.py; else CUBLAS_WORKSPACE_CONFIG=$1 timeout 120 python3 .exp/s37/ws.py; fi >> $OUT/ws.jsonl 2>>$OUT/ws.err; }
for order in "unset :4096:4:16:8 :4096:2:16:8" ":4096:2:16:8 :4096:4:16:8 unset" ":4096:4:16:8 unset :4096:2:16:8"; do
  for c in $order; do run_ws $c; done
done
python3 - <<'PY'
import json, os, statistics
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/ws.jsonl")]
by = {}
for r in rows:
    by.setdefault(r["env"], []).append(r)
envs = ["(unset)", ":4096:4:16:8", ":4096:2:16:8"]
print("| M | " + " | ".join(f"{e} ({by[e][0]['workspace_bytes'] >> 20} MiB)" for e in envs) + " |")
for m in rows[0]["steps"]:
    cells = []
    for e in envs:
        v = [x["steps"][m]["total_ms"] for x in by[e]]
        cells.append(f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")
    print(f"| {m} | " + " | ".join(cells) + " |")
PY
for c in :4096:4:16:8 unset :4096:2:16:8; do
  if [ $c = unset ]; then unset CUBLAS_WORKSPACE_CONFIG; else export CUBLAS_WORKSPACE_CONFIG=$c; fi
  L=$(echo $c | tr ':' 'x')
  ONLY=w1 timeout 200 bash deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu $OUT/w1-$L > $OUT/w1-$L.txt 2>&1
  echo "w1 $c:"; tail -3 $OUT/w1-$L.txt | head -1; tail -1 $OUT/w1-$L.txt; grep -E 'workspace|non_torch' $OUT/w1-$L/metrics-*.txt
  rm -rf $OUT/w1-$L/server-*.log $OUT/w1-$L/smi-*.txt $OUT/w1-$L/w1.txt
done
