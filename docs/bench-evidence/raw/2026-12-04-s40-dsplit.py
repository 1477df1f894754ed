"""Session 40 run 9: the prefill attention tile with D split across warp pairs (patch
raw/2026-12-04-s40-dsplit.patch): 8 warps, 64 rows, each pair of warps on 16 rows, one warp per D half
(S partials exchanged through shared memory, O at D / 4 registers a thread). Two builds: DS2 (171
registers, one CTA per H200 SM) and DS2x2 (capped at 128 registers for two CTAs per SM; 32-40 bytes
spilled). Against today's tile (4 warps, one per 16 rows).

1. correctness against the fp32 reference (with and without the gate, forced 2 KV splits, NaN-poisoned
   dead cache slots) on serving shapes, chunks after prefixes mid-block, and twice (bitwise repeat);
2. timings: each batch's calls back to back in a CUDA graph over rotated input sets (>= 4x L2), three
   rounds in rotated order, median us; TFLOP/s as a fraction of a measured 8192^3 bf16 matmul.
"""

import statistics
import sys

import torch

from engine.bench import attention as A
from engine.ops.attention import cuda as attn
from engine.ops.attention.batches import make_batch, reference_fp32, rel

H, HKV, D, BS = 16, 4, 256, 32
G = H // HKV
SHAPES = {"DS1 (today)": None, "DS2": (32, 8, 2, 2, 1), "DS2x2": (32, 8, 2, 2, 2)}


def run(batch, shape, gate=True, splits=None, poisoned=False):
    args = batch.args(*batch.poisoned_caches()) if poisoned else batch.args()
    return attn.paged_attention(*args, gate=batch.gate if gate else None, splits=splits, shape=shape)


def correctness() -> bool:
    ok = True
    cases = {
        "prefill 2 x 1024": [(0, 1024)] * 2,
        "mixed 2x1024 + 32 dec": [(1100, 1)] * 32 + [(0, 1024)] * 2,
        "chunks after prefixes": [(1500, 512), (37, 63), (64, 65), (100, 1000), (16, 2)],
        "short prompts": [(0, 1), (0, 63), (0, 64), (0, 65)],
    }
    for label, specs in cases.items():
        batch = make_batch(specs, BS, HKV, G, D, seed=11)
        for gate in (True, False):
            want = reference_fp32(batch, gate)
            for name, shape in SHAPES.items():
                for splits in (None, 2):
                    got = run(batch, shape, gate, splits, poisoned=True)
                    again = run(batch, shape, gate, splits, poisoned=True)
                    err = rel(got, want)
                    same = torch.equal(got, again)
                    good = err < 5e-3 and same and bool(torch.isfinite(got).all())
                    ok &= good
                    if not good or (gate and splits is None):
                        print(f"  {label:<24} gate={gate!s:<5} {name:<12} splits={splits}: rel {err:.2e}"
                              f" repeat-equal {same} {'ok' if good else 'WRONG'}", flush=True)
        del batch
    return ok


def timings() -> None:
    mm_rate = A.matmul_rate()
    print(f"bf16 matmul {mm_rate / 1e12:.0f} TFLOP/s")
    shapes = {
        "prefill 32 x 1024": [(0, 1024)] * 32,
        "prefill 2 x 1024": [(0, 1024)] * 2,
        "prefill 1 x 1024": [(0, 1024)],
        "mixed 2x1024 + 32 dec": [(1100, 1)] * 32 + [(0, 1024)] * 2,
        "chunk 2048 after 8192": [(8192, 2048)],
    }
    for label, specs in shapes.items():
        one = make_batch(specs, BS, HKV, G, D, seed=7)
        fl = A.causal_flops(one)
        batches = A.sets(specs, A.kv_bytes(one), seed=200)
        plans = {n: A.plan_of(one, None, sh) for n, sh in SHAPES.items()}
        times = {n: [] for n in SHAPES}
        names = list(SHAPES)
        for rnd in range(3):
            for n in names[rnd:] + names[:rnd]:
                sh = SHAPES[n]
                calls = [lambda b=b, sh=sh: run(b, sh) for b in batches]
                times[n].append(A.graph_us(calls))
        cells = []
        for n, t in times.items():
            us = statistics.median(t)
            cells.append(f"{n} {us:7.1f} us {fl / (us * 1e-6) / mm_rate:5.1%} [{A.short(plans[n])}]")
        print(f"{label:<24}" + "  ".join(cells), flush=True)
        del one, batches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    for n, sh in SHAPES.items():
        if sh is not None:
            plan = A.plan_of(make_batch([(0, 64)], BS, HKV, G, D, seed=1), None, sh)
            fn = attn._function(plan.name, plan.smem)
            print(f"{n}: {plan.name} {fn.num_regs} regs, {fn.local_size_bytes} B local, smem {plan.smem}")
    good = correctness()
    print("correct:", good, flush=True)
    timings()
    sys.exit(0 if good else 1)
