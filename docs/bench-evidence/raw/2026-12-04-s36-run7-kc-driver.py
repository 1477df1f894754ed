"""Session 36 run 7: the run-4 form of the wide GEMM with KC 32-k sub-chunks a pipeline step (the
per-step overhead over KC times the bytes), timed beside cuBLAS at M = 32 / 64 on the 4B's decode
shapes; weights rotate over copies (>= 200 MB a round) so they come from HBM. Checked against fp32."""
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from engine.ops.gemm import wide  # noqa: E402

DEV = "cuda"
SHAPES = (("in_proj", 12352, 2560), ("qkv", 10240, 2560), ("gate_up", 18432, 2560), ("down", 2560, 9216),
          ("out_proj", 2560, 4096), ("lm_head", 248320, 2560))
CFGS = ((4, 4, 4, 1), (4, 2, 4, 2), (4, 2, 3, 4), (4, 2, 2, 4), (8, 2, 2, 2), (8, 2, 1, 4), (4, 3, 3, 2))


def timeit(fns, reps=10):
    for f in fns:
        f()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        for f in fns:
            f()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps / len(fns) * 1e3


g = torch.Generator(device=DEV).manual_seed(0)
for m in (32, 64):
    for name, n, k in SHAPES:
        copies = max(2, -(-200_000_000 // (n * k * 2)))
        ws = [(torch.randn(n, k, device=DEV, generator=g) * k**-0.5).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(m, k, device=DEV, generator=g).to(torch.bfloat16)
        want = x.float() @ ws[0].float().T
        cub = timeit([lambda w=w: F.linear(x, w) for w in ws])
        row = []
        for warps, depth, ctas, kc in CFGS:
            wide.KC, wide.CHUNK = kc, 32 * kc
            for splits in (None,):
                try:
                    plan = wide.make_plan(m, n, k, 132, (warps, depth, ctas), splits=splits, smem_per_sm=1 << 30)
                except ValueError:
                    continue
                err = (wide.wide(x, ws[0], plan).float() - want).abs().max().item()
                ok = err <= 2**-7 * want.abs().max().item()
                us = timeit([lambda w=w, p=plan: wide.wide(x, w, p) for w in ws])
                row.append((us, f"{warps},{depth},{ctas},kc{kc} x{plan.splits} {us:.1f}{'' if ok else ' WRONG'}"))
        row.sort()
        gb = n * k * 2 / 1e3
        print(f"M={m} {name:9s} cuBLAS {cub:6.1f} us ({gb / cub / 4290:.0%}) | best " +
              " | ".join(f"{r[1]} ({gb / r[0] / 4290:.0%})" for r in row[:4]), flush=True)
        del ws
        torch.cuda.empty_cache()
