#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc2
SMALL=":4096:2:16:8"
for r in A B B A A B; do
  if [ $r = B ]; then CUBLAS_WORKSPACE_CONFIG=$SMALL timeout 120 python3 .exp/s37/ws.py >> $OUT/ws.jsonl 2>>$OUT/ws.err;
  else timeout 120 python3 .exp/s37/ws.py >> $OUT/ws.jsonl 2>>$OUT/ws.err; fi
done
python3 - <<'PY'
import json, os, statistics
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/ws.jsonl")]
for r in rows:
    print(r["env"], "ws", r["workspace_bytes"] >> 20, "MiB", " ".join(f"M{m}:{v['total_ms']:.3f}" for m, v in r["steps"].items()))
by = {}
for r in rows:
    by.setdefault(r["env"], []).append(r)
envs = list(by)
print("| M | " + " | ".join(envs) + " | ratio |")
for m in rows[0]["steps"]:
    med = [statistics.median(x["steps"][m]["total_ms"] for x in by[e]) for e in envs]
    print(f"| {m} | " + " | ".join(f"{v:.3f}" for v in med) + f" | {med[1] / med[0]:.3f} |")
for m in rows[0]["steps"]:
    for name in rows[0]["steps"][m]["per_us"]:
        vals = [statistics.median(x["steps"][m]["per_us"][name] for x in by[e]) for e in envs]
        if abs(vals[1] / vals[0] - 1) > 0.03:
            print(f"  M{m} {name}: {vals[0]:.1f} vs {vals[1]:.1f} us")
PY
for r in A B; do
  if [ $r = B ]; then export CUBLAS_WORKSPACE_CONFIG=$SMALL; fi
  ONLY=w1 timeout 200 bash deploy/bench-workloads.sh .gpu/qwen3.5-4b .gpu $OUT/w1-$r > $OUT/w1-$r.txt 2>&1
  echo "w1 $r (${CUBLAS_WORKSPACE_CONFIG:-unset}):"; tail -4 $OUT/w1-$r.txt; cat $OUT/w1-$r/metrics-*.txt | grep -i peak | head -3
done
rm -rf $OUT/w1-*/server-*.log $OUT/w1-*/smi-*.txt
