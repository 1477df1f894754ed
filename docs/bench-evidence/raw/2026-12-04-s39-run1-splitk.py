"""Session 39 run 1 probe: can the 2,560-row decode projections (out_proj, o_proj, down) beat
F.linear (cuBLAS split-K + its reduce kernel) as an explicit K-split strided-batched GEMM with fp32
partials (torch.bmm(..., out_dtype=float32)), leaving the sum to the add+RMSNorm that follows?
Graph replay, each call on its own weight copy (weights from HBM). Prints us per call and the kernels."""
import statistics, sys
import torch
import torch.nn.functional as F

DEV = "cuda"
SHAPES = (("down", 2560, 9216, 32), ("out_proj/o_proj", 2560, 4096, 32))

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
    xs = x.view(m, s, kc).permute(1, 0, 2)          # [S, M, kc], lda = K
    ws = w.view(n, s, kc).permute(1, 2, 0)          # [S, kc, N] (col-major per batch), ldb = K
    return xs, ws

def variants(k):
    out = [("linear", None)]
    for s in (2, 3, 4, 6, 8, 12, 16):
        if k % (s * 64) == 0: out.append((f"bmm s{s}", s))
    return out

torch.manual_seed(0)
res = {}
for name, n, k, per in SHAPES:
    R = max(8, (4 * (60 << 20)) // (n * k * 2) + 1)
    ws = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16) * 0.02 for _ in range(R)]
    for m in (16, 32, 64):
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        want = x.float() @ ws[0].float().T
        for vname, s in variants(k):
            if s is None:
                got = F.linear(x, ws[0]).float()
            else:
                xs, wv = split_views(x, ws[0], s)
                got = torch.bmm(xs, wv, out_dtype=torch.float32).sum(0)
            err = (got - want).abs().max().item()
            res[(name, m, vname)] = (err, [])
    # timing, order alternated: rounds A..., then reversed
    for m in (16, 32, 64):
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        vs = variants(k)
        for rnd in range(2):
            order = vs if rnd == 0 else vs[::-1]
            for vname, s in order:
                if s is None:
                    calls = [(lambda w=w: F.linear(x, w)) for w in ws]
                else:
                    calls = []
                    for w in ws:
                        xs, wv = split_views(x, w, s)
                        calls.append(lambda xs=xs, wv=wv: torch.bmm(xs, wv, out_dtype=torch.float32))
                res[(name, m, vname)][1].append(replay_us(calls))
# kernels of one call each (profiler)
from torch.profiler import profile, ProfilerActivity
for name, n, k, per in SHAPES:
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16); x = torch.randn(32, k, device=DEV, dtype=torch.bfloat16)
    for vname, s in variants(k)[:4]:
        f = (lambda: F.linear(x, w)) if s is None else (lambda s=s: torch.bmm(*split_views(x, w, s), out_dtype=torch.float32))
        f(); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            f(); torch.cuda.synchronize()
        ks = [(e.name[:70], round(e.device_time, 1)) for e in p.events() if e.device_type.name == "CUDA"]
        print(f"kernels {name} M32 {vname}: {ks}")
print(f"\n{'shape':16} {'M':>3} {'variant':9} {'max err':>9} {'us r1':>7} {'us r2':>7}")
for (name, m, v), (err, ts) in res.items():
    print(f"{name:16} {m:3d} {v:9} {err:9.2e} {ts[0]:7.2f} {ts[1]:7.2f}")
