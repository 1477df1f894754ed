"""``python -m engine.bench.fused``: the fused bf16 elementwise kernels (cuda/norm/fused.cu) against
the torch reference compositions they replace, at Qwen3.5-4B shapes (hidden 2560, intermediate 9216,
16 query / 4 kv heads of 256, rotary 64) for a W1 prefill step (N = 2,048 tokens) and a decode step
(N = 32).

Timing as engine.bench.kernels: each call captured R times into one CUDA graph with R different input sets
(so consecutive calls never find their inputs in L2), CUDA events around the replays, median of the
replays divided by R. The fraction is of the device-copy bandwidth measured here the same way (a
256 MiB copy), bytes = the op's unavoidable DRAM traffic (each input read once, each output written
once). The last lines estimate one model step: per layer 2 add_rms_norm + 1 silu_mul, and one
qk_norm_rope_kv per full-attention layer (32 and 8 for the 4B). ``--model-step`` then runs the 4B
dummy model with and without the fused arms (engine/bench/fused_model.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from engine.bench.kernels import time_graph
from engine.ops import reference as ref

HID, INTER, H, HKV, D, ROT, THETA, BS = 2560, 9216, 16, 4, 256, 64, 1e7, 16
LAYERS, ATTN_LAYERS = 32, 8
EPS = 1e-6
DEV = "cuda"


def bf16(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale).to(DEV, torch.bfloat16)


def copy_bandwidth() -> float:
    """Device-copy bytes/s (read + write) of a 256 MiB buffer, graph-replayed like the ops."""
    n = 128 << 20  # bf16 elements
    srcs = [torch.empty(n, dtype=torch.bfloat16, device=DEV).normal_() for _ in range(2)]
    dsts = [torch.empty_like(s) for s in srcs]
    us = time_graph(lambda i: lambda: dsts[i % 2].copy_(srcs[i % 2]), 4 * n)
    return 4 * n / (us * 1e-6)


def row_err(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.float().reshape(-1, got.shape[-1]), want.float().reshape(-1, want.shape[-1])
    return ((g - w).abs().amax(-1) / w.abs().amax(-1).clamp_min(1e-30)).max().item()


def bench(n: int, fused, rows: list, rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """Times of (reference, fused) per op at n tokens, appended to ``rows`` as table lines."""
    sets = 8
    xs = [bf16(rng, n, HID) for _ in range(sets)]
    rs = [bf16(rng, n, HID, scale=4.0) for _ in range(sets)]
    w = bf16(rng, HID, scale=0.3)
    gus = [bf16(rng, n, 2 * INTER, scale=2.0) for _ in range(sets)]
    width = 2 * H * D + 2 * HKV * D
    projs = [bf16(rng, n, width, scale=2.0) for _ in range(sets)]

    def attn(i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qg, k, v = torch.split(projs[i % sets], [2 * H * D, HKV * D, HKV * D], dim=-1)
        return qg.reshape(n, H, 2 * D), k.reshape(n, HKV, D), v.reshape(n, HKV, D)

    qn, kn = bf16(rng, D, scale=0.3), bf16(rng, D, scale=0.3)
    pos = torch.from_numpy(rng.integers(0, 4096, n)).to(DEV)
    nb = sets * (n // BS + 2) + 1
    kc = torch.zeros(nb, BS, HKV, D, dtype=torch.bfloat16, device=DEV)
    vc = torch.zeros_like(kc)
    slot_sets = [torch.from_numpy(rng.permutation(nb * BS)[:n].astype(np.int64)).to(DEV) for _ in range(sets)]

    # correctness at this shape before timing (the tests cover the edge cases)
    y, h = fused.add_rms_norm(xs[0], rs[0], w, EPS)
    yr, hr = ref.add_rms_norm(xs[0], rs[0], w, EPS)
    kc2, vc2 = kc.clone(), vc.clone()
    q = fused.qk_norm_rope_kv(*attn(0), qn, kn, EPS, pos, ROT, THETA, kc, vc, slot_sets[0])
    qr = ref.qk_norm_rope_kv(*attn(0), qn, kn, EPS, pos, ROT, THETA, kc2, vc2, slot_sets[0])
    errs = (
        f"add_rms_norm y {row_err(y, yr):.1e} h equal {torch.equal(h, hr)}; "
        f"silu_mul {row_err(fused.silu_mul(gus[0]), ref.silu_mul(gus[0])):.1e}; "
        f"qk q {row_err(q, qr):.1e} k cache {row_err(kc, kc2):.1e} v equal {torch.equal(vc, vc2)}"
    )
    print(f"  check N={n}: {errs} (row-scaled max error vs the reference)", flush=True)

    arn_bytes = 4 * n * HID * 2
    silu_bytes = 3 * n * INTER * 2
    qk_bytes = 2 * (n * H * D + 2 * n * HKV * D) * 2
    cases = {
        "add_rms_norm": (
            arn_bytes,
            lambda impl: lambda i: lambda: impl.add_rms_norm(xs[i % sets], rs[i % sets], w, EPS),
        ),
        "silu_mul": (silu_bytes, lambda impl: lambda i: lambda: impl.silu_mul(gus[i % sets])),
        "qk_norm_rope_kv": (
            qk_bytes,
            lambda impl: (
                lambda i: (
                    lambda: impl.qk_norm_rope_kv(
                        *attn(i), qn, kn, EPS, pos, ROT, THETA, kc, vc, slot_sets[i % sets]
                    )
                )
            ),
        ),
    }
    out = {}
    for name, (nbytes, make) in cases.items():
        t_ref = time_graph(make(ref), nbytes)
        t_fused = time_graph(make(fused), nbytes)
        out[name] = (t_ref, t_fused)
        rows.append((name, n, nbytes, t_ref, t_fused))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[2048, 32])
    ap.add_argument("--model-step", action="store_true", help="also time the 4B dummy model's forward")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    from engine.ops.norm import fused_cuda

    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    copy = copy_bandwidth()
    print(f"device copy {copy / 1e12:.2f} TB/s (256 MiB, graph-replayed)", flush=True)
    rng = np.random.default_rng(0)
    rows: list = []
    steps = {n: bench(n, fused_cuda, rows, rng) for n in args.tokens}
    print("\n| op | N | ref us | fused us | speedup | fused TB/s | of copy |\n|---|---|---|---|---|---|---|")
    for name, n, nbytes, t_ref, t_fused in rows:
        bw = nbytes / (t_fused * 1e-6)
        print(
            f"| {name} | {n} | {t_ref:.1f} | {t_fused:.1f} | {t_ref / t_fused:.1f}x | {bw / 1e12:.2f} "
            f"| {bw / copy:.0%} |"
        )
    per = {"add_rms_norm": 2 * LAYERS, "silu_mul": LAYERS, "qk_norm_rope_kv": ATTN_LAYERS}
    for n, times in steps.items():
        t_ref = sum(per[k] * times[k][0] for k in per) / 1e3
        t_fused = sum(per[k] * times[k][1] for k in per) / 1e3
        print(f"4B step at N={n}: these ops {t_ref:.2f} ms reference -> {t_fused:.2f} ms fused")
    if args.model_step:
        from engine.bench.fused_model import model_steps

        with tempfile.TemporaryDirectory() as tmp:
            model_steps(Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
