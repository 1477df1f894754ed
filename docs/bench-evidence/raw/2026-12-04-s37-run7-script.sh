#!/usr/bin/env bash
# session 37 run 7: the attention kernel's exp2 as one ex2.approx.ftz: tests, then A B B A A B timings
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v deltaserve) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DELTASERVE_CACHE=/tmp/dscache CUPY_CACHE_DIR=/tmp/cc7
timeout 200 python3 -m pytest -q -m gpu tests/ops/test_attention_cuda.py -rf > $OUT/tests.txt 2>&1; echo "tests rc $?"; tail -2 $OUT/tests.txt
for r in A B B A A B; do
  if [ $r = A ]; then DELTASERVE_CUDA_DIR=$PWD/.exp/base_cuda timeout 120 python3 .exp/s37/pa_exp.py $OUT/ab.jsonl 2>>$OUT/ab.err;
  else timeout 120 python3 .exp/s37/pa_exp.py $OUT/ab.jsonl 2>>$OUT/ab.err; fi
done
python3 - <<'PY'
import json, os, statistics
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/ab.jsonl")]
a = [r for r in rows if r["src"] != "checkout"]; b = [r for r in rows if r["src"] == "checkout"]
print(f"{len(a)} A runs, {len(b)} B runs")
print("| shape | A us (runs) | B us (runs) | B/A | bits |")
print("|---|---|---|---|---|")
for k in rows[0]["us"]:
    ma, mb = statistics.median(x["us"][k] for x in a), statistics.median(x["us"][k] for x in b)
    same = len({x["digest"][k] for x in a + b}) == 1
    ra = " ".join(f"{x['us'][k]:.1f}" for x in a); rb = " ".join(f"{x['us'][k]:.1f}" for x in b)
    print(f"| {k} | {ma:.1f} ({ra}) | {mb:.1f} ({rb}) | {mb / ma:.3f} | {'equal' if same else 'DIFFER'} |")
PY
