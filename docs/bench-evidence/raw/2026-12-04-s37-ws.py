"""Session 37: cuBLAS GEMM time per 4B step shape under the process's CUBLAS_WORKSPACE_CONFIG."""
import json
import os
import statistics

import torch
import torch.nn.functional as F

# (name, N, K, per step) of Qwen3.5-4B: 24 GDN layers, 8 attention layers, 32 MLPs, the lm_head
SHAPES = [("in_proj", 12352, 2560, 24), ("qkv", 10240, 2560, 8), ("gate_up", 18432, 2560, 32),
          ("down", 2560, 9216, 32), ("out_proj", 2560, 4096, 24), ("o_proj", 2560, 4096, 8),
          ("lm_head", 248320, 2560, 1)]


def replay_us(fn, reps=15):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(4):
            fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); g.replay(); e.record(); e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / 4)
    return statistics.median(ts)


def main():
    torch.cuda.init()
    base = torch.cuda.memory_reserved()
    x0 = torch.randn(8, 2560, device="cuda", dtype=torch.bfloat16)
    w0 = torch.randn(2560, 2560, device="cuda", dtype=torch.bfloat16)
    before = torch.cuda.memory_allocated()
    F.linear(x0, w0)
    torch.cuda.synchronize()
    ws = torch.cuda.memory_allocated() - before - x0.shape[0] * 2560 * 2
    out = {"env": os.environ.get("CUBLAS_WORKSPACE_CONFIG", "(unset)"), "workspace_bytes": ws, "steps": {}}
    for m in (16, 32, 64, 1024, 2048):
        total = 0.0
        per = {}
        for name, n, k, count in SHAPES:
            if m > 64 and name == "lm_head":
                continue  # prefill steps take the lm_head of the last rows only
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            t = replay_us(lambda: F.linear(x, w))
            per[name] = round(t, 2)
            total += count * t
            del w, x
        out["steps"][m] = {"total_ms": round(total / 1e3, 4), "per_us": per}
    out["reserved_growth"] = torch.cuda.memory_reserved() - base
    print(json.dumps(out))


main()
