"""Session 39 run 2 probe: the wide decode projections (in_proj, qkv, gate_up) at M = 16 / 32 / 64,
F.linear against an explicit K-split bmm (fp32 partials) followed by torch's sum over the splits
into bf16 (what a reduce would cost at least). Graph replay, one weight copy per call."""
import statistics
import torch
import torch.nn.functional as F

DEV = "cuda"
SHAPES = (("in_proj", 12352, 2560), ("qkv_proj", 10240, 2560), ("gate_up", 18432, 2560))

def replay_us(calls, reps=30):
    for c in calls: c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls: c()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); g.replay(); e.record(); e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / len(calls))
    return statistics.median(ts)

def split_views(x, w, s):
    m, k = x.shape; n = w.shape[0]; kc = k // s
    return x.view(m, s, kc).permute(1, 0, 2), w.view(n, s, kc).permute(1, 2, 0)

res = {}
torch.manual_seed(0)
for name, n, k in SHAPES:
    R = max(8, (4 * (60 << 20)) // (n * k * 2) + 1)
    ws = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(R)]
    for m in (16, 32, 64):
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        vs = [("linear", None, False)] + [(f"bmm s{s}", s, False) for s in (2, 4, 5)] + [(f"bmm s{s}+sum", s, True) for s in (2, 4)]
        for rnd in range(2):
            for vname, s, red in (vs if rnd == 0 else vs[::-1]):
                if s is None:
                    calls = [(lambda w=w: F.linear(x, w)) for w in ws]
                else:
                    calls = []
                    for w in ws:
                        xs, wv = split_views(x, w, s)
                        if red:
                            calls.append(lambda xs=xs, wv=wv: torch.bmm(xs, wv, out_dtype=torch.float32).sum(0).to(torch.bfloat16))
                        else:
                            calls.append(lambda xs=xs, wv=wv: torch.bmm(xs, wv, out_dtype=torch.float32))
                res.setdefault((name, m, vname), []).append(replay_us(calls))
from torch.profiler import profile, ProfilerActivity
for name, n, k in SHAPES:
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16); x = torch.randn(32, k, device=DEV, dtype=torch.bfloat16)
    for vname, s in (("linear", None), ("bmm s2", 2)):
        f = (lambda: F.linear(x, w)) if s is None else (lambda s=s: torch.bmm(*split_views(x, w, s), out_dtype=torch.float32))
        f(); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            f(); torch.cuda.synchronize()
        print(f"kernels {name} M32 {vname}:", [(e.name[:60], round(e.device_time, 1)) for e in p.events() if e.device_type.name == "CUDA"])
print(f"\n{'shape':10} {'M':>3} {'variant':12} {'us r1':>7} {'us r2':>7}")
for (name, m, v), ts in res.items():
    print(f"{name:10} {m:3d} {v:12} {ts[0]:7.2f} {ts[1]:7.2f}")
