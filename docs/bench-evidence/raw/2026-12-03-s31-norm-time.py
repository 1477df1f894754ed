"""Session 31: the gated RMSNorm at one row per warp (per_lane=4) vs two (per_lane=8), in the GDN
core's layout (x the delta rule's [T, 32, 128] output, z the [T, 32, 128] view of the 4B's fused
projection, bf16 weight), each variant captured in a CUDA graph of 20 calls and replayed in 9
alternating rounds; medians in us per call, bytes moved (x, z read, out written) per us as TB/s,
and whether both give the same bits."""

import statistics

import numpy as np
import torch

from engine.ops.norm import cuda as norm

dev = torch.device("cuda")
rng = np.random.default_rng(0)
NV, DV, W = 32, 128, 12352  # the 4B's value heads, head dim, fused GDN projection width


def randn(*shape):
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(dev, torch.bfloat16)


def timed(fns, reps=20, rounds=9):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns.values():
            f()
    torch.cuda.current_stream().wait_stream(s)
    graphs = {}
    for k, f in fns.items():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                f()
        graphs[k] = g
    res = {k: [] for k in fns}
    for r in range(rounds):
        for k in list(fns) if r % 2 == 0 else list(reversed(list(fns))):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graphs[k].replay()
            a.record()
            graphs[k].replay()
            b.record()
            b.synchronize()
            res[k].append(a.elapsed_time(b) * 1000 / reps)
    return {k: statistics.median(v) for k, v in res.items()}


print(f"gated RMSNorm ({torch.cuda.get_device_name()}): us per call, median of 9 alternating rounds")
w = (torch.from_numpy(rng.random(DV, dtype=np.float32)) + 0.5).to(dev, torch.bfloat16)
for T in (2048, 1024, 256, 32):
    x = randn(T, NV, DV)
    proj = randn(T, W)
    z = proj[:, 8192 : 8192 + NV * DV].view(T, NV, DV)
    outs = {p: torch.empty(T * NV, DV, dtype=torch.bfloat16, device=dev) for p in (4, 8)}
    fns = {p: (lambda p=p: norm.gated_rms_norm(x, z, w, 1e-6, outs[p].view(T, NV, DV), per_lane=p)) for p in (4, 8)}
    t = timed(fns)
    same = torch.equal(outs[4], outs[8])
    mb = 3 * T * NV * DV * 2 / 1e6
    print(f"T={T:5d}  one row/warp {t[4]:7.2f} us ({mb / t[4]:.2f} TB/s)  two rows/warp {t[8]:7.2f} us "
          f"({mb / t[8]:.2f} TB/s)  ratio {t[8] / t[4]:.3f}  same bits {same}")
