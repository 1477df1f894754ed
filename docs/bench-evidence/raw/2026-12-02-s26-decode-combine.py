"""Session 26: what the split-KV combine launch costs a decode attention call (H200, 4B shapes).

Times each decode batch's attention call captured in a graph (engine.bench.kernels.replay_us, input
sets rotated past L2) as shipped (main kernel + combine) and with the combine launch dropped (main
kernel only: its output is then wrong, so this is a timing bound, not a kernel), in the order
full, main, main, full. The difference bounds what folding the combine into the main kernel can win.
"""

import torch

from engine.bench import attention as BA
from engine.bench import kernels as B
from engine.ops.attention import cuda as attn

H, HKV, D, BS, CTX = BA.H, BA.HKV, BA.D, BA.BS, BA.CTX
real_launch = attn.launch
drop = {"on": False}


def combine_fns() -> list:
    """The combine kernels of this tree (run 1's one per head dim, or run 2's by split count)."""
    if hasattr(attn, "combine_name"):
        return [attn._function(attn.combine_name(D, s), 0) for s in (4, 16, 64)]
    return [attn._function(f"paged_attn_combine_kernel<{D}>", 0)]


def launch(fn, *args, **kw):
    if drop["on"] and any(fn is f for f in combine_fns()):
        return None
    return real_launch(fn, *args, **kw)


attn.launch = launch
mm = BA.matmul_rate()
copy_bw = max(BA.copy_bandwidth())
print(f"copy {copy_bw / 1e12:.2f} TB/s")
rows = []
for b in (1, 8, 32, 64):
    specs = [(CTX, 1)] * b
    one = BA.make_batch(specs, BS, HKV, H // HKV, D, seed=1)
    sets = BA.sets(specs, BA.kv_bytes(one), seed=100)
    plan = BA.plan_of(one)
    t = {}
    for label in ("full", "main", "main", "full"):
        drop["on"] = label == "main"
        us = B.replay_us([lambda x=x: attn.paged_attention(*x.args(), gate=x.gate) for x in sets])
        t.setdefault(label, []).append(us)
    drop["on"] = False
    f, m = min(t["full"]), min(t["main"])
    frac = BA.kv_bytes(one) / copy_bw * 1e6
    rows.append((b, BA.short(plan), t["full"], t["main"], f - m, frac / f, frac / m))
    del sets, one
    torch.cuda.empty_cache()
print("| batch | plan | full us | main only us | combine costs | full % copy | main % copy |")
print("|---|---|---|---|---|---|---|")
for b, p, f, m, d, ff, fm in rows:
    fs, ms = " / ".join(f"{x:.1f}" for x in f), " / ".join(f"{x:.1f}" for x in m)
    print(f"| {b} | {p} | {fs} | {ms} | {d:.1f} us | {ff:.1%} | {fm:.1%} |")
