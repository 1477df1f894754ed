"""Session 37: the eight-warp Q-in-registers prefill attention beside the default, order-alternated."""
import statistics
import sys

import torch

from engine.bench import attention as A
from engine.bench import kernels as B
from engine.ops.attention.batches import make_batch

SHAPES = [None, (32, 8, 2), (32, 8, 3), (16, 8, 3), (16, 8, 4)]
BATCHES = {
    "prefill 32 x 1024": [(0, 1024)] * 32,
    "prefill 2 x 1024": [(0, 1024)] * 2,
    "prefill 1 x 1024": [(0, 1024)],
    "prefill 4 x 512": [(0, 512)] * 4,
    "mixed 2x1024 + 32 dec": [(A.CTX, 1)] * 32 + [(0, 1024)] * 2,
    "chunk 512 after 3000": [(3000, 512)],
}


def main():
    mode = sys.argv[1]
    if mode == "one":  # for ncu: one shape, one batch, two calls
        sh = None if sys.argv[2] == "default" else tuple(int(x) for x in sys.argv[2].split(","))
        batch = make_batch(BATCHES["prefill 32 x 1024"], A.BS, A.HKV, A.H // A.HKV, A.D, seed=7)
        f = A.call(batch, shape=sh)
        f(); torch.cuda.synchronize(); f(); torch.cuda.synchronize()
        return
    mm = A.matmul_rate()
    print(f"bf16 mm {mm / 1e12:.0f} TFLOP/s", flush=True)
    table = []
    for label, specs in BATCHES.items():
        batch = make_batch(specs, A.BS, A.HKV, A.H // A.HKV, A.D, seed=7)
        fl = A.causal_flops(batch)
        ok = [sh for sh in SHAPES if A.check(f"{label} {sh}", batch, shape=sh)]
        times = {sh: [] for sh in ok}
        for rnd in range(4):
            for sh in (ok if rnd % 2 == 0 else ok[::-1]):
                times[sh].append(B.replay_us([A.call(batch, shape=sh)] * 4))
        base = statistics.median(times[None])
        for sh in ok:
            t = statistics.median(times[sh])
            plan = A.short(A.plan_of(batch, None, sh))
            spread = max(times[sh]) - min(times[sh])
            table.append((label, plan, t, fl / (t * 1e-6) / mm, t / base, spread))
            print(f"  {label:<24} {plan:<18} {t:8.1f} us  {fl / (t * 1e-6) / mm:6.1%} mm  x{t / base:.3f}  "
                  f"rounds {' '.join(f'{x:.1f}' for x in times[sh])}", flush=True)
        del batch
        torch.cuda.empty_cache()
    print("\n| batch | plan | us (median of 4, A B B A) | of bf16 mm | vs default | spread us |")
    print("|---|---|---|---|---|---|")
    for label, plan, t, frac, ratio, spread in table:
        print(f"| {label} | {plan} | {t:.1f} | {frac:.1%} | {ratio:.3f} | {spread:.1f} |")


main()
