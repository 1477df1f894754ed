"""Session 30 micro-benchmarks (device run 1), each variant captured in a CUDA graph of ``reps``
calls, replayed in alternating rounds; medians of the rounds in us per call.

mlp:    the 4B's MLP (gate|up GEMM, the in-place SiLU-mul kernel, down GEMM) over T tokens, whole or
        in token chunks that reuse one scratch region (does the [chunk, 2I] projection stay in L2 for
        the SiLU-mul and the down GEMM?). Also: each chunked variant's max difference to the whole.
argmax: torch's argmax vs engine.ops.sample.cuda.argmax over bf16 [rows, 248320] logits.
"""

import statistics
import sys

import numpy as np
import torch

from engine.ops.norm.fused_cuda import silu_mul
from engine.ops.sample import cuda as sample

dev = torch.device("cuda")
H, I, V = 2560, 9216, 248320
rng = np.random.default_rng(0)


def randn(*shape, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).to(dev, torch.bfloat16)


def timed(fns: dict, reps: int = 10, rounds: int = 7) -> dict:
    graphs = {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns.values():
            f()
    torch.cuda.current_stream().wait_stream(s)
    for k, f in fns.items():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                f()
        graphs[k] = g
    res = {k: [] for k in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(list(fns)))
        for k in order:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graphs[k].replay()
            a.record()
            graphs[k].replay()
            b.record()
            b.synchronize()
            res[k].append(a.elapsed_time(b) * 1000 / reps)
    return {k: statistics.median(v) for k, v in res.items()}


def mlp_bench():
    wgu, wd = randn(2 * I, H, scale=0.02), randn(H, I, scale=0.02)
    print(f"mlp ({torch.cuda.get_device_name()}): us per MLP call, median of 7 alternating rounds")
    for T in (2048, 1024):
        x = randn(T, H)
        scratch = torch.empty(T * 2 * I, dtype=torch.bfloat16, device=dev)
        outs = {}

        def make(chunk):
            out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
            outs[chunk] = out

            def f():
                for s in range(0, T, chunk):
                    n = min(T, s + chunk) - s
                    gu = scratch[: n * 2 * I].view(n, 2 * I)
                    torch.mm(x[s : s + n], wgu.t(), out=gu)
                    act = silu_mul(gu, out=gu[:, :I])
                    torch.mm(act, wd.t(), out=out[s : s + n])

            return f

        chunks = [c for c in (T, 1024, 512, 256, 128) if c <= T]
        fns = {c: make(c) for c in chunks}
        t = timed(fns)
        for c in chunks:
            d = (outs[c].float() - outs[T].float()).abs().max().item()
            print(f"  T {T:5d} chunk {c:5d}: {t[c]:8.1f} us  ({t[c] / t[T]:.3f}x)  max |diff| vs whole {d:.3g}")
        # the parts alone at the whole size: GEMMs and the SiLU-mul
        gu = scratch[: T * 2 * I].view(T, 2 * I)
        parts = {
            "gate_up": lambda: torch.mm(x, wgu.t(), out=gu),
            "silu_mul": lambda: silu_mul(gu, out=gu[:, :I]),
            "down": lambda: torch.mm(gu[:, :I], wd.t(), out=outs[T]),
        }
        tp = timed(parts)
        print("  parts at T %d: " % T + ", ".join(f"{k} {v:.1f} us" for k, v in tp.items()))


def argmax_bench():
    print(f"argmax ({torch.cuda.get_device_name()}): bf16 [rows, {V}], us per call, median of 7 alternating rounds")
    for rows in (1, 8, 32, 64):
        x = randn(rows, V, scale=3.0)
        assert torch.equal(sample.argmax(x), x.argmax(-1))
        t = timed({"torch": lambda: x.argmax(-1), "kernel": lambda: sample.argmax(x)}, reps=20)
        gbs = rows * V * 2 / (t["kernel"] * 1e-6) / 1e12
        print(f"  rows {rows:3d}: torch {t['torch']:6.1f} us, kernel {t['kernel']:6.1f} us "
              f"({t['kernel'] / t['torch']:.2f}x; kernel {gbs:.2f} TB/s), splits {sample.plan(rows, V, 8, sample._sms(0))[0]}")


if __name__ == "__main__":
    for what in sys.argv[1:] or ["mlp", "argmax"]:
        {"mlp": mlp_bench, "argmax": argmax_bench}[what]()
