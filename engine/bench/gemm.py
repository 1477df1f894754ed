"""``python -m engine.bench.gemm``: the skinny GEMM (cuda/gemm/skinny.cu) beside F.linear (cuBLAS) on the
Qwen3.5-4B decode GEMMs at M = 1, 2, 4, 8 rows.

Correctness first (every shape at M = 1 and 8 against the fp32 product, and cuBLAS's own error beside
it), then timings as engine.bench.kernels: R calls captured back to back in one CUDA graph, each on its
own weight copy so that one replay streams >= 4x the L2 (the weights come from HBM, as in a decode
step), CUDA events around >= 50 replays, the median divided by R. Bytes = weights + x + y; the fraction
is of the device copy bandwidth measured the same way in this run (the better of a 1 GiB memcpy and an
elementwise copy, read + write: a memcpy node in a graph ran at only 2.7 TB/s on the H200). The
decode-step total sums each shape times its count per step (24 GDN and 8 attention layers, 32 MLPs,
one lm_head).
``--sweep`` also times other (tiles, warps, unroll) launches at M = 1 and 8 and prints the best.
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
REPS = 50
SWEEP = [(t, w, u) for t in (1, 2) for w in (4, 8, 16, 32) for u in (1, 2, 4)]


def copy_bandwidth() -> float:
    """Bytes/s (read + write) of a 1 GiB device copy: the better of memcpy and an elementwise kernel."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device=DEV).normal_()
    dst = torch.empty_like(src)
    memcpy = replay_us([lambda: dst.copy_(src)] * 4, REPS)
    kern = replay_us([lambda: torch.mul(src, 1.0, out=dst)] * 4, REPS)
    return 2 * src.numel() * 2 / (min(memcpy, kern) * 1e-6)


def gbs(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


def check(name: str, x: torch.Tensor, w: torch.Tensor) -> bool:
    want = x.float() @ w.float().T
    got, cub = gemm.skinny(x, w).float(), F.linear(x, w).float()
    scale = want.abs().max().item()
    e, ec, d = ((a - b).abs().max().item() for a, b in ((got, want), (cub, want), (got, cub)))
    ok = bool(torch.isfinite(got).all()) and e <= 2**-8 * scale * 1.5 and d <= 3 * ec + 1e-6 * scale
    print(
        f"  check {name:<14} M={x.shape[0]}: max |err| vs fp32 {e:.2e} (cuBLAS {ec:.2e}, vs cuBLAS {d:.2e}, "
        f"max |y| {scale:.2f}) {'ok' if ok else 'WRONG'}",
        flush=True,
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="also time other launch shapes at M = 1, 8")
    ap.add_argument("--sweep-seconds", type=float, default=60.0, help="stop the sweep after this long")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    print(f"device {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}", flush=True)
    copy = copy_bandwidth()
    print(f"device copy {copy / 1e12:.2f} TB/s (1 GiB, graph-replayed)", flush=True)
    gen = torch.Generator(device=DEV).manual_seed(0)
    table: list[tuple[str, int, int, int, float, float]] = []  # name, M, count, bytes, us skinny, us cuBLAS
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
            t_sk = replay_us([lambda x=x, w=w: gemm.skinny(x, w) for x, w in pairs], REPS)
            t_cb = replay_us([lambda x=x, w=w: F.linear(x, w) for x, w in pairs], REPS)
            table.append((name, m, count, nbytes, t_sk, t_cb))
            plan = gemm.plan_for(xs[m][0], ws[0])
            b_sk, b_cb = gbs(nbytes, t_sk), gbs(nbytes, t_cb)
            print(
                f"  {name:<14} M={m}: skinny {t_sk:8.1f} us {b_sk:7.0f} GB/s ({b_sk * 1e9 / copy:4.0%})  "
                f"cuBLAS {t_cb:8.1f} us {b_cb:7.0f} GB/s ({b_cb * 1e9 / copy:4.0%})  [{plan.name}]",
                flush=True,
            )
            if args.sweep and m in (1, 8) and time.monotonic() < sweep_end:
                sweep_rows.append(sweep(name, pairs, nbytes, copy, sweep_end))
        del ws, xs
        torch.cuda.empty_cache()

    print(f"\ndevice copy {copy / 1e12:.2f} TB/s")
    print("| GEMM | N x K | M | per step | skinny us | GB/s | of copy | cuBLAS us | GB/s | of copy |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    dims = {s[0]: f"{s[1]} x {s[2]}" for s in SHAPES}
    for name, m, count, nbytes, t_sk, t_cb in table:
        b_sk, b_cb = gbs(nbytes, t_sk), gbs(nbytes, t_cb)
        print(
            f"| {name} | {dims[name]} | {m} | {count} | {t_sk:.1f} | {b_sk:.0f} | {b_sk * 1e9 / copy:.0%} "
            f"| {t_cb:.1f} | {b_cb:.0f} | {b_cb * 1e9 / copy:.0%} |"
        )
    print("\n| decode step, all GEMMs | M | GB | skinny ms | of copy | cuBLAS ms | of copy | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    for m in ROWS:
        rows = [r for r in table if r[1] == m]
        nbytes = sum(r[2] * r[3] for r in rows)
        t_sk = sum(r[2] * r[4] for r in rows) / 1e3
        t_cb = sum(r[2] * r[5] for r in rows) / 1e3
        floor = nbytes / copy * 1e3
        print(
            f"| step | {m} | {nbytes / 1e9:.2f} | {t_sk:.3f} | {floor / t_sk:.0%} | {t_cb:.3f} "
            f"| {floor / t_cb:.0%} | {t_cb / t_sk:.2f}x |"
        )
    if sweep_rows:
        print("\nsweep (tiles, warps, unroll): us, the best first")
        print("\n".join(sweep_rows))
    return 0


def sweep(name: str, pairs, nbytes: int, copy: float, end: float) -> str:
    """Every SWEEP launch of this shape (until ``end``), as one line: the best few with their us."""
    x0, w0 = pairs[0]
    m, n, k = x0.shape[0], w0.shape[0], x0.shape[1]
    base = gemm.plan_for(x0, w0)
    want = gemm.skinny(x0, w0)
    got = []
    for tiles, warps, unroll in SWEEP:
        if time.monotonic() > end:
            break
        plan = gemm.make_plan(m, n, k, 1, (warps, 4), tiles=tiles, warps=warps, unroll=unroll)
        if not torch.equal(gemm.skinny(x0, w0, plan).float(), want.float()):
            # another K split sums in another order: allow the last bit, never more than 1 ulp
            diff = (gemm.skinny(x0, w0, plan).float() - want.float()).abs().max().item()
            if diff > 2**-7 * want.float().abs().max().item():
                got.append((float("inf"), f"{tiles},{warps},{unroll} WRONG"))
                continue
        us = replay_us([lambda x=x, w=w, p=plan: gemm.skinny(x, w, p) for x, w in pairs], REPS)
        got.append((us, f"{tiles},{warps},{unroll}"))
    if not got:
        return f"  {name:<14} M={m}: out of sweep time"
    got.sort()
    best = ", ".join(f"({cfg}) {us:.1f}" for us, cfg in got[:6])
    base_cfg = f"{base.tiles},{base.warps},{base.unroll}"
    frac = gbs(nbytes, got[0][0]) * 1e9 / copy
    return f"  {name:<14} M={m} [table {base_cfg}]: {best}; best {frac:.0%} of copy"


if __name__ == "__main__":
    sys.exit(main())
