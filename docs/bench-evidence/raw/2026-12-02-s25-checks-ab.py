"""Order-alternated A/B (A = `git show 9e3ceec:server/text_checks.py` and `...:engine/frontend/input_processor.py` saved under /tmp, B = the tree) of the per-request checks a 1,024-token-id
completion body goes through: the lone-surrogate walk and the token-id range check. us per call."""
import importlib.util, json, random, statistics, sys, time
sys.path.insert(0, "/work/main")
from server import text_checks as new_tc
from engine.frontend.input_processor import InputProcessor
spec = importlib.util.spec_from_file_location("old_tc", "/tmp/old_text_checks.py"); old_tc = importlib.util.module_from_spec(spec); spec.loader.exec_module(old_tc)
spec = importlib.util.spec_from_file_location("old_ip", "/tmp/old_ip.py"); old_ip = importlib.util.module_from_spec(spec); sys.modules["old_ip"] = old_ip; spec.loader.exec_module(old_ip)
ids = [random.Random(i).randrange(3, 248000) for i in range(1024)]
body = json.loads(json.dumps({"model": "m", "prompt": ids, "max_tokens": 128, "stream": True, "temperature": 0}))
ipA, ipB = old_ip.InputProcessor(None, 248320, 4096), InputProcessor(None, 248320, 4096)
def t(fn, n=400):
    s = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - s) / n * 1e6
res = {k: [] for k in ("surrogate A", "surrogate B", "ids A", "ids B")}
for r in range(6):
    order = ("A", "B") if r % 2 == 0 else ("B", "A")
    for side in order:
        tc = old_tc if side == "A" else new_tc
        ip = ipA if side == "A" else ipB
        res[f"surrogate {side}"].append(t(lambda: tc.find_surrogate(body)))
        res[f"ids {side}"].append(t(lambda: ip.check_token_ids(ids, "prompt")))
for k, v in res.items():
    print(f"{k:<12} median {statistics.median(v):8.1f} us  runs {' '.join(f'{x:.1f}' for x in v)}")
