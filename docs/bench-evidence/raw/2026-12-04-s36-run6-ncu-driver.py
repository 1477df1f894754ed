"""Session 36: the run-4 form of the wide GEMM (register pipeline, x ring, persistent grid) launched a
few times for Nsight Compute. python3 .exp/ncu_driver.py {gate_up|lm_head|time}"""
import sys

import torch

sys.path.insert(0, ".")
from engine.ops.gemm import wide  # noqa: E402

DEV = "cuda"


def make(n, k, m):
    g = torch.Generator(device=DEV).manual_seed(0)
    w = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).to(torch.bfloat16)
    x = torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16)
    return x, w


def run(n, k, m, cfg, splits, reps):
    x, w = make(n, k, m)
    plan = wide.make_plan(m, n, k, 132, cfg, splits=splits, smem_per_sm=1 << 30)
    want = x.float() @ w.float().T
    for _ in range(reps):
        y = wide.wide(x, w, plan)
    torch.cuda.synchronize()
    print(n, k, m, plan, "max err", (y.float() - want).abs().max().item(), flush=True)
    return x, w, plan


def timed(n, k, m, cfg, splits):
    x, w, plan = run(n, k, m, cfg, splits, 3)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        wide.wide(x, w, plan)
    e.record()
    torch.cuda.synchronize()
    print(f"  {n}x{k} M={m} {cfg} x{splits}: {s.elapsed_time(e) / 20 * 1e3:.1f} us (L2-warm weights)", flush=True)


mode = sys.argv[1]
if mode == "gate_up":
    run(18432, 2560, 32, (4, 4, 4), 1, 3)
elif mode == "lm_head":
    run(248320, 2560, 32, (4, 4, 4), 1, 3)
else:
    for cfg in ((4, 4, 4), (4, 2, 4), (8, 4, 2)):
        timed(18432, 2560, 32, cfg, 1)
        timed(248320, 2560, 32, cfg, 1)
