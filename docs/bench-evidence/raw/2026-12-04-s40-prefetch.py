"""Session 40: the skinny GEMM (M <= 8) with L2 prefetches of its weights.

Variants (engine.ops.gemm.cuda.PREFETCH = (pre, ahead)): ``pre`` k per row prefetched into L2 by every
CTA before its PDL wait (-1 = the CTA's whole slice), ``ahead`` iterations each warp prefetches ahead in
its K loop. Prefetches change no arithmetic: outputs must be bit-equal to variant (0, 0).
1. every 4B decode shape at M = 1 and 8: bit-equality, then R calls (own weight copies, >= 4x L2)
   back to back in one graph captured with programmatic launches, median of 30 replays, us per call;
   variants in rotated order over 3 rounds.
2. the real decode step (defaults, dummy 4B weights) at batch 1 and 8: its graph recaptured per
   variant, replayed alone 200 times (median), variants rotated over 3 rounds.
"""

import statistics
import sys

import numpy as np
import torch

from engine.bench import steps as st
from engine.bench.gemm import SHAPES
from engine.bench.kernels import L2_BYTES, time_eager
from engine.ops import launch_ex
from engine.ops.arms import DEFAULT_ARMS
from engine.ops.gemm import cuda as gemm

VARIANTS = [(0, 0), (-1, 0), (512, 0), (0, 2), (0, 4), (-1, 2)]
ROUNDS = 3


def rotated(r):
    k = r % len(VARIANTS)
    return VARIANTS[k:] + VARIANTS[:k]


def shapes():
    g = torch.Generator(device="cuda").manual_seed(0)
    ok = True
    res = {}
    for name, n, k, _ in SHAPES:
        wbytes = n * k * 2
        r = max(2, min(64, -(-4 * L2_BYTES // wbytes)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02 for _ in range(r)]
        for m in (1, 8):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
            ref = None
            for v in VARIANTS:
                gemm.PREFETCH = v
                y = gemm.skinny(x, ws[0])
                torch.cuda.synchronize()
                if ref is None:
                    ref = y.clone()
                elif not torch.equal(y, ref):
                    ok = False
                    print(f"NOT BIT-EQUAL {name} m={m} {v}")
            times = {v: [] for v in VARIANTS}
            for rnd in range(ROUNDS):
                for v in rotated(rnd):
                    gemm.PREFETCH = v
                    calls = [lambda w=w, x=x: gemm.skinny(x, w) for w in ws]
                    for c in calls:
                        c()
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with launch_ex.programmatic_launches(), torch.cuda.graph(graph):
                        for c in calls:
                            c()
                    times[v].append(time_eager(graph.replay, 30) / len(calls))
                    del graph
            res[(name, m)] = {v: statistics.median(t) for v, t in times.items()}
            cells = "  ".join(f"{res[(name, m)][v]:7.2f}" for v in VARIANTS)
            print(f"{name:14s} M={m}  {cells}", flush=True)
        del ws
        torch.cuda.empty_cache()
    gemm.PREFETCH = (0, 0)
    per_step = {}
    for m in (1, 8):
        per_step[m] = {v: sum(res[(nm, m)][v] * cnt for nm, _, _, cnt in SHAPES) for v in VARIANTS}
        print(f"decode-step GEMMs M={m} (us): " + "  ".join(f"{v}: {per_step[m][v]:.0f}" for v in VARIANTS))
    print("bit-equal across variants:", ok)
    return ok


def decode_steps(model):
    runner = st.step_runner(model, "dummy", sorted(DEFAULT_ARMS), "lazy")
    kinds = st.Steps(runner, np.random.default_rng(0)).kinds()
    for b in (1, 8):
        seqs = kinds[f"decode b{b}"]
        times = {v: [] for v in VARIANTS}
        toks = {}
        for rnd in range(ROUNDS):
            for v in rotated(rnd):
                gemm.PREFETCH = v
                runner.graphs.graphs.clear()
                out = runner.execute_model(seqs)
                toks.setdefault(v, str(out)[:200])
                runner.execute_model(seqs)
                times[v].append(st.replay_ms(runner, seqs, 200))
        cells = [f"{v}: {statistics.median(t):.4f} {[round(x, 3) for x in t]}" for v, t in times.items()]
        print(f"decode b{b} replay ms (rounds): " + "  ".join(cells), flush=True)
    gemm.PREFETCH = (0, 0)


if __name__ == "__main__":
    print("variants (pre, ahead):", VARIANTS)
    ok = shapes()
    decode_steps(sys.argv[1])
    sys.exit(0 if ok else 1)
