"""Inputs shared by the fused elementwise ops' CPU and GPU tests: seeded numpy data (independent of the
CPU's vector instructions) shaped like the model's projection views and paged caches."""

from __future__ import annotations

import numpy as np
import torch

DTYPES = [torch.float32, torch.bfloat16]
BOUND = 8e-3


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0, dtype=torch.float32, device="cpu"):
    """Seeded normal data from numpy (independent of the CPU's vector instructions)."""
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale).to(
        device=device, dtype=dtype
    )


def attn_views(rng, t, h, hkv, d, dtype, device="cpu"):
    """qg [T, H, 2D], k, v [T, Hkv, D] as strided views of one fused projection output, like the model's."""
    proj = rand(rng, t, 2 * h * d + 2 * hkv * d, scale=2.0, dtype=dtype, device=device)
    qg, k, v = torch.split(proj, [2 * h * d, hkv * d, hkv * d], dim=-1)
    return qg.reshape(t, h, 2 * d), k.reshape(t, hkv, d), v.reshape(t, hkv, d)


def paged(rng, t, bs, hkv, d, dtype, device="cpu"):
    """Caches with random contents and a scattered slot_mapping (distinct slots, any block order)."""
    nb = t // bs + 5
    kc = rand(rng, nb, bs, hkv, d, dtype=dtype, device=device)
    vc = rand(rng, nb, bs, hkv, d, dtype=dtype, device=device)
    slots = torch.from_numpy(rng.permutation(nb * bs)[:t].astype(np.int64)).to(device)
    return kc, vc, slots
