"""Session 29 probe: which cuBLAS entry point runs the 4B's decode projections fastest at M = 16, 32, 64.

F.linear (cublasGemmEx: split-K plus a separate reduce kernel on the 2,560-row outputs), torch.addmm
with a zero bias (torch's cublasLt gemm_and_bias path, where it applies), and F.linear with
torch.backends.cuda.preferred_blas_library("cublaslt"). Timed as engine.bench.gemm (R calls in one
graph, each on its own weight copy so a replay streams >= 4x the L2; median of 50 replays / R).
Each variant's max |difference| from F.linear is printed beside it (different kernels may round
differently; the zero bias adds nothing). Usage: python docs/bench-evidence/raw/2026-12-02-s29-blas.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.bench.gemm import SHAPES, copy_bandwidth, gbs
from engine.bench.kernels import L2_BYTES, replay_us

DEV = "cuda"


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    copy = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}, copy {copy / 1e12:.2f} TB/s", flush=True)
    gen = torch.Generator(device=DEV).manual_seed(0)
    totals: dict[tuple[int, str], float] = {}
    for name, n, k, count in SHAPES:
        sets = max(2, min(64, -(-4 * L2_BYTES // (n * k * 2))))
        ws = [torch.randn(n, k, device=DEV, generator=gen).mul_(k**-0.5).to(torch.bfloat16) for _ in range(sets)]
        zero = torch.zeros(n, dtype=torch.bfloat16, device=DEV)
        for m in (16, 32, 64):
            xs = [torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16) for _ in ws]
            pairs = list(zip(xs, ws, strict=True))
            nbytes = n * k * 2 + (m * k + m * n) * 2
            base = F.linear(xs[0], ws[0])
            row = []
            for label in ("gemm", "addmm", "lt"):
                if label == "gemm":
                    calls = [lambda x=x, w=w: F.linear(x, w) for x, w in pairs]
                    out = base
                elif label == "addmm":
                    calls = [lambda x=x, w=w: torch.addmm(zero, x, w.t()) for x, w in pairs]
                    out = torch.addmm(zero, xs[0], ws[0].t())
                else:
                    torch.backends.cuda.preferred_blas_library("cublaslt")
                    calls = [lambda x=x, w=w: F.linear(x, w) for x, w in pairs]
                    out = F.linear(xs[0], ws[0])
                us = replay_us(calls, 50)
                torch.backends.cuda.preferred_blas_library("cublas")
                diff = (out.float() - base.float()).abs().max().item()
                totals[(m, label)] = totals.get((m, label), 0.0) + count * us
                row.append(f"{label} {us:7.1f} us {gbs(nbytes, us) * 1e9 / copy:4.0%} d{diff:.1e}")
            print(f"{name:<14} M={m:<3} " + "  ".join(row), flush=True)
        del ws
        torch.cuda.empty_cache()
    print("\ndecode step, all GEMMs (ms):")
    for m in (16, 32, 64):
        print(f"  M={m}: " + "  ".join(f"{lb} {totals[(m, lb)] / 1e3:.3f}" for lb in ("gemm", "addmm", "lt")))


if __name__ == "__main__":
    main()
