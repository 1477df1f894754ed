"""``python -m engine.bench.gemm``: the skinny GEMM (cuda/gemm/skinny.cu) beside F.linear (cuBLAS) on the
Qwen3.5-4B decode GEMMs at M = 1, 2, 4, 8 rows.

Correctness first (every shape at M = 1 and 8 against the fp32 product, cuBLAS's own error beside it),
then timings as engine.bench.kernels: R calls captured back to back in one CUDA graph, each on its own
weight copy so that one replay streams >= 4x the L2 (the weights come from HBM, as in a decode step),
CUDA events around >= 50 replays, the median divided by R. Three launches: the skinny kernel plain,
``overlap`` (programmatic stream serialization, sm_90+: what the wrapper does inside graphs) and cuBLAS.
Back to back, an overlapped GEMM prefetches its weights while the previous GEMM drains, which a model
step only partly sees (its GEMMs follow small elementwise or attention kernels), so ``chain`` also times
each GEMM behind a small elementwise kernel that writes its x, minus that kernel alone (M = 1, 8).
Bytes = weights + x + y; the fraction is of the device copy bandwidth measured here (the better of a
1 GiB memcpy and an elementwise copy, read + write). Decode-step totals sum each shape times its count
per step (24 GDN and 8 attention layers, 32 MLPs, one lm_head). ``--sweep``: other launch shapes.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from engine.bench.kernels import L2_BYTES, replay_us
from engine.ops.gemm import cuda as gemm

DEV = "cuda"
# (name, N, K, per decode step); qkv_proj = [q|gate] 2*16*256 + k, v 2*4*256
SHAPES = (
    ("gdn in_proj", 12352, 2560, 24),
    ("attn qkv_proj", 10240, 2560, 8),
    ("mlp gate_up", 18432, 2560, 32),
    ("mlp down", 2560, 9216, 32),
    ("gdn out_proj", 2560, 4096, 24),
    ("attn o_proj", 2560, 4096, 8),
    ("lm_head", 248320, 2560, 1),
)
ROWS = (1, 2, 4, 8)
CHAIN_ROWS = (1, 8)
REPS = 50
IMPLS = ("skinny", "overlap", "cuBLAS")
SWEEP = [(w, u) for w in (8, 16, 32) for u in (1, 2, 4)]


def copy_bandwidth() -> float:
    """Bytes/s (read + write) of a 1 GiB device copy: the better of memcpy and an elementwise kernel."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device=DEV).normal_()
    dst = torch.empty_like(src)
    memcpy = replay_us([lambda: dst.copy_(src)] * 4, REPS)
    kern = replay_us([lambda: torch.mul(src, 1.0, out=dst)] * 4, REPS)
    return 2 * src.numel() * 2 / (min(memcpy, kern) * 1e-6)


def gbs(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


def call(impl: str, x: torch.Tensor, w: torch.Tensor, plan: gemm.Plan | None = None):
    if impl == "cuBLAS":
        return lambda: F.linear(x, w)
    return lambda: gemm.skinny(x, w, plan, overlap=impl == "overlap")


def check(name: str, x: torch.Tensor, w: torch.Tensor) -> bool:
    want = x.float() @ w.float().T
    got, cub = gemm.skinny(x, w, overlap=False).float(), F.linear(x, w).float()
    scale = want.abs().max().item()
    e, ec, d = ((a - b).abs().max().item() for a, b in ((got, want), (cub, want), (got, cub)))
    ok = bool(torch.isfinite(got).all()) and e <= 2**-8 * scale * 1.5 and d <= 3 * ec + 1e-6 * scale
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        over = gemm.skinny(x, w, overlap=True).float()
    side.synchronize()
    ok = ok and torch.equal(over, got)
    print(
        f"  check {name:<14} M={x.shape[0]}: max |err| vs fp32 {e:.2e} (cuBLAS {ec:.2e}, vs cuBLAS {d:.2e}, "
        f"max |y| {scale:.2f}), overlapped equal {torch.equal(over, got)}: {'ok' if ok else 'WRONG'}",
        flush=True,
    )
    return ok


def chain_us(impl: str, pairs, xbufs) -> float:
    """us of one GEMM behind an elementwise kernel that writes its x (pair time minus the kernel's)."""
    pre = [lambda x=x, xb=xb: torch.mul(x, 1.0, out=xb) for (x, _), xb in zip(pairs, xbufs, strict=True)]
    gemms = [call(impl, xb, w) for (_, w), xb in zip(pairs, xbufs, strict=True)]
    both = [c for p, g in zip(pre, gemms, strict=True) for c in (p, g)]
    return 2 * replay_us(both, REPS) - replay_us(pre, REPS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="also time other (warps, unroll) at M = 1, 8")
    ap.add_argument("--sweep-seconds", type=float, default=60.0, help="stop the sweep after this long")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    # a side stream, as inside the graphs: overlapped launches never go to the legacy default stream
    with torch.cuda.stream(torch.cuda.Stream()):
        return run(args)


def run(args: argparse.Namespace) -> int:
    props = torch.cuda.get_device_properties(0)
    print(f"device {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}", flush=True)
    copy = copy_bandwidth()
    print(f"device copy {copy / 1e12:.2f} TB/s (1 GiB, graph-replayed)", flush=True)
    gen = torch.Generator(device=DEV).manual_seed(0)
    table: list[tuple[str, int, int, int, dict[str, float]]] = []  # name, M, count, bytes, us per impl
    chains: list[tuple[str, int, int, int, dict[str, float]]] = []
    sweep_rows: list[str] = []
    sweep_end = time.monotonic() + args.sweep_seconds
    for name, n, k, count in SHAPES:
        wbytes = n * k * 2
        sets = max(2, min(64, -(-4 * L2_BYTES // wbytes)))
        ws = [
            torch.randn(n, k, device=DEV, generator=gen).mul_(k**-0.5).to(torch.bfloat16) for _ in range(sets)
        ]
        xs = {m: [torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16) for _ in ws] for m in ROWS}
        if not all(check(name, xs[m][0], ws[0]) for m in (1, 8)):
            print(f"{name}: wrong results, not timed", file=sys.stderr)
            return 1
        for m in ROWS:
            nbytes = wbytes + (m * k + m * n) * 2
            pairs = list(zip(xs[m], ws, strict=True))
            us = {impl: replay_us([call(impl, x, w) for x, w in pairs], REPS) for impl in IMPLS}
            table.append((name, m, count, nbytes, us))
            notes = "  ".join(f"{i} {t:7.1f} us {gbs(nbytes, t) * 1e9 / copy:4.0%}" for i, t in us.items())
            print(f"  {name:<14} M={m}: {notes}  [{gemm.plan_for(xs[m][0], ws[0]).name}]", flush=True)
            if m in CHAIN_ROWS:
                xbufs = [torch.empty_like(x) for x in xs[m]]
                cus = {impl: chain_us(impl, pairs, xbufs) for impl in IMPLS}
                chains.append((name, m, count, nbytes, cus))
                notes = "  ".join(f"{i} {t:7.1f} us" for i, t in cus.items())
                print(f"  {name:<14} M={m} behind an elementwise kernel: {notes}", flush=True)
            if args.sweep and m in (1, 8) and time.monotonic() < sweep_end:
                sweep_rows.append(sweep(name, pairs, nbytes, copy, sweep_end))
        del ws, xs
        torch.cuda.empty_cache()
    report(table, chains, copy)
    if sweep_rows:
        print("\nsweep (warps, unroll), overlapped launches: us, the best first")
        print("\n".join(sweep_rows))
    return 0


def report(table, chains, copy: float) -> None:
    dims = {s[0]: f"{s[1]} x {s[2]}" for s in SHAPES}
    print(f"\ndevice copy {copy / 1e12:.2f} TB/s; back to back in a graph, us and fraction of copy")
    print("| GEMM | N x K | M | per step | skinny | overlap | cuBLAS |\n|---|---|---|---|---|---|---|")
    for name, m, count, nbytes, us in table:
        cells = " | ".join(f"{us[i]:.1f} ({gbs(nbytes, us[i]) * 1e9 / copy:.0%})" for i in IMPLS)
        print(f"| {name} | {dims[name]} | {m} | {count} | {cells} |")
    print("\nbehind an elementwise kernel (that kernel's time subtracted), us and fraction of copy")
    print("| GEMM | M | skinny | overlap | cuBLAS |\n|---|---|---|---|---|")
    for name, m, _, nbytes, us in chains:
        cells = " | ".join(f"{us[i]:.1f} ({gbs(nbytes, us[i]) * 1e9 / copy:.0%})" for i in IMPLS)
        print(f"| {name} | {m} | {cells} |")
    print("\n| decode step, all GEMMs | M | GB | skinny ms | overlap ms | cuBLAS ms | overlap vs cuBLAS |")
    print("|---|---|---|---|---|---|---|")
    for label, rows_of in (("back to back", table), ("behind a kernel", chains)):
        for m in ROWS:
            rows = [r for r in rows_of if r[1] == m]
            if not rows:
                continue
            nbytes = sum(r[2] * r[3] for r in rows)
            ms = {i: sum(r[2] * r[4][i] for r in rows) / 1e3 for i in IMPLS}
            floor = nbytes / copy * 1e3
            cells = " | ".join(f"{ms[i]:.3f} ({floor / ms[i]:.0%})" for i in IMPLS)
            print(f"| {label} | {m} | {nbytes / 1e9:.2f} | {cells} | {ms['cuBLAS'] / ms['overlap']:.2f}x |")


def sweep(name: str, pairs, nbytes: int, copy: float, end: float) -> str:
    """Every SWEEP launch of this shape (until ``end``), as one line: the best few with their us."""
    x0, w0 = pairs[0]
    m, n, k = x0.shape[0], w0.shape[0], x0.shape[1]
    base = gemm.plan_for(x0, w0)
    want = gemm.skinny(x0, w0, overlap=False).float()
    got = []
    for warps, unroll in SWEEP:
        if time.monotonic() > end:
            break
        plan = gemm.make_plan(m, n, k, 1, (warps, 4), warps=warps, unroll=unroll)
        # another K split sums in another order: allow the last bit, never more than 1 ulp
        diff = (gemm.skinny(x0, w0, plan, overlap=False).float() - want).abs().max().item()
        if diff > 2**-7 * want.abs().max().item():
            got.append((float("inf"), f"{warps},{unroll} WRONG"))
            continue
        us = replay_us([call("overlap", x, w, plan) for x, w in pairs], REPS)
        got.append((us, f"{warps},{unroll}"))
    if not got:
        return f"  {name:<14} M={m}: out of sweep time"
    got.sort()
    best = ", ".join(f"({cfg}) {us:.1f}" for us, cfg in got[:5])
    frac = gbs(nbytes, got[0][0]) * 1e9 / copy
    return f"  {name:<14} M={m} [table {base.warps},{base.unroll}]: {best}; best {frac:.0%} of copy"


if __name__ == "__main__":
    sys.exit(main())
