"""Session 40 run 2: the narrow projections (out_proj / o_proj K 4096, down K 9216, N 2560) at M <= 8
as an explicit split-K in the skinny kernel (fp32 partials over S slices of K, summed by the next
add_rms_norm), against the skinny kernel's bf16 output + add_rms_norm, and torch.bmm's split (cuBLAS).

1. correctness: the partials' sum vs the fp32 product; the op's (y, h) vs the composed path's.
2. (GEMM, norm) pairs back to back in one graph captured with programmatic launches, own weights and
   residual per pair (>= 4x L2 of weights a replay), median of 30 replays, us per pair; rotated x 3.
3. decode b1 / b8 replays (dummy 4B, defaults) with split_norm.SKINNY_SPLITS 0 / 2 / 4, rotated x 3.
"""

import statistics
import sys

import numpy as np
import torch

from engine.bench import steps as st
from engine.bench.kernels import L2_BYTES, time_eager
from engine.ops import launch_ex
from engine.ops.arms import DEFAULT_ARMS
from engine.ops.compile import kernel
from engine.ops.gemm import cuda as gemm
from engine.ops.gemm import split_norm
from engine.ops.norm import fused_cuda

SHAPES = (("out/o_proj", 2560, 4096), ("down", 2560, 9216))
ROWS = (1, 2, 4, 8)
ROUNDS = 3
EPS = 1e-6


def pair(variant, x, w, res, nw):
    if variant == "A":
        y = gemm.linear(x, w)
        return fused_cuda.add_rms_norm(y, res, nw, EPS)
    if variant in ("B2", "B4"):
        parts = gemm.skinny_parts(x, w, int(variant[1]))
        return fused_cuda.add_rms_norm_partials(parts, res, nw, EPS)
    s = 4
    m, k = x.shape
    kc = k // s
    ap = x.as_strided((s, m, kc), (kc, x.stride(0), 1))
    wp = w.as_strided((s, kc, w.shape[0]), (kc, 1, k))
    parts = torch.bmm(ap, wp, out_dtype=torch.float32)
    return fused_cuda.add_rms_norm_partials(parts, res, nw, EPS)


VARIANTS = ("A", "B2", "B4", "C4")


def micro():
    g = torch.Generator(device="cuda").manual_seed(0)
    ok = True
    for name, n, k in SHAPES:
        r = max(2, min(64, -(-4 * L2_BYTES // (n * k * 2))))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02 for _ in range(r)]
        nw = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
            res = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(r)]
            want = x.float() @ ws[0].float().T
            for sp in (2, 4):
                parts = gemm.skinny_parts(x, ws[0], sp)
                err = (parts.sum(0) - want).abs().max().item() / want.abs().max().item()
                plan = gemm.make_plan(m, n, k // sp, 132, (16, 4))
                regs = kernel(gemm.SRC, f"skinny_gemm_kernel<{plan.rows}, 1, 16, {plan.unroll}, true>").num_regs
                if err > 1e-5:
                    ok = False
                print(f"{name} M={m} S={sp}: parts rel err {err:.2e}, unroll {plan.unroll}, {regs} regs")
            ya, ha = pair("A", x, ws[0], res[0], nw)
            for v in VARIANTS[1:]:
                yb, hb = pair(v, x, ws[0], res[0], nw)
                dy = (yb.float() - ya.float()).abs().max().item()
                dh = (hb.float() - ha.float()).abs().max().item()
                print(f"  {v} vs A: y max diff {dy:.3e}, h max diff {dh:.3e}")
            times = {v: [] for v in VARIANTS}
            for rnd in range(ROUNDS):
                order = VARIANTS[rnd % 4:] + VARIANTS[:rnd % 4]
                for v in order:
                    calls = [lambda w=w, rs=rs, v=v, x=x, nw=nw: pair(v, x, w, rs, nw) for w, rs in zip(ws, res, strict=True)]
                    for c in calls:
                        c()
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with launch_ex.programmatic_launches(), torch.cuda.graph(graph):
                        for c in calls:
                            c()
                    times[v].append(time_eager(graph.replay, 30) / len(calls))
                    del graph
            cells = "  ".join(f"{v} {statistics.median(t):6.2f}" for v, t in times.items())
            print(f"{name:10s} M={m}  us per pair: {cells}", flush=True)
        del ws
        torch.cuda.empty_cache()
    return ok


def decode_steps(model):
    runner = st.step_runner(model, "dummy", sorted(DEFAULT_ARMS), "lazy")
    kinds = st.Steps(runner, np.random.default_rng(0)).kinds()
    variants = (0, 2, 4)
    for b in (1, 8):
        seqs = kinds[f"decode b{b}"]
        times = {v: [] for v in variants}
        for rnd in range(ROUNDS):
            for v in variants[rnd % 3:] + variants[:rnd % 3]:
                split_norm.SKINNY_SPLITS = v
                runner.graphs.graphs.clear()
                runner.execute_model(seqs)
                runner.execute_model(seqs)
                times[v].append(st.replay_ms(runner, seqs, 200))
        cells = [f"S={v}: {statistics.median(t):.4f} {[round(x, 3) for x in t]}" for v, t in times.items()]
        print(f"decode b{b} replay ms: " + "  ".join(cells), flush=True)
    split_norm.SKINNY_SPLITS = 0


if __name__ == "__main__":
    ok = micro()
    decode_steps(sys.argv[1])
    print("partials within 1e-5:", ok)
    sys.exit(0 if ok else 1)
