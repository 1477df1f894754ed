"""How the CUDA kernels are checked against the fp32 torch reference, shared by every op's test file.

Random data in varlen batches with lengths 1, 2, 3, 63, 64, 65, 1000, with and without initial state, a
padding sequence (slot 0) in every batch; outputs poisoned before each run (an element a kernel forgets
to write stays NaN); each run twice and compared bitwise. Only the gpu-marked tests call these.
"""

from __future__ import annotations

import torch

DEV = "cuda"
LENS = (1, 2, 3, 63, 64, 65, 1000)


def poison(*shapes_dtypes) -> None:
    """Fill, then free, blocks of the sizes the op will allocate, so torch's caching allocator hands
    the op NaN-filled memory: an element the kernel forgets to write stays NaN."""
    for shape, dtype in shapes_dtypes:
        torch.empty(shape, dtype=dtype, device=DEV).fill_(float("nan"))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    assert torch.isfinite(a).all(), "non-finite values (an unwritten or poisoned element?)"
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def varlen(lens, init_mask, seed):
    """qsl [B+1], slots [B] (a zero-length padding sequence with slot 0 appended), has_init [B]."""
    g = torch.Generator().manual_seed(seed)
    lens = list(lens) + [0]
    B = len(lens)
    qsl = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    slots = (torch.randperm(B - 1, generator=g) + 1).tolist() + [0]
    has_init = list(init_mask)[: B - 1] + [False]
    return (
        qsl.to(DEV),
        torch.tensor(slots, dtype=torch.int32, device=DEV),
        torch.tensor(has_init, device=DEV),
        max(lens),
        B,
    )


def bf16(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(torch.bfloat16)


def twice(fn, pools, *poison_spec):
    """Run fn twice from the same pool contents; both runs must agree bitwise."""
    saved = [p.clone() for p in pools]
    poison(*poison_spec)
    out1 = fn()
    after1 = [p.clone() for p in pools]
    for p, s in zip(pools, saved, strict=True):
        p.copy_(s)
    poison(*poison_spec)
    out2 = fn()
    outs1 = out1 if isinstance(out1, tuple) else (out1,)
    outs2 = out2 if isinstance(out2, tuple) else (out2,)
    for a, b in zip(outs1, outs2, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)) or torch.equal(a, b), (
            "run-to-run mismatch"
        )
    for a, p in zip(after1, pools, strict=True):
        assert torch.equal(a, p), "state run-to-run mismatch"
    return out1


def gdn_inputs(T, nk, nv, scale_g=1.0):
    q = bf16(T, nk, 128)
    k = bf16(T, nk, 128)
    v = bf16(T, nv, 128)
    g = -torch.rand(T, nv, device=DEV) * scale_g  # log decay <= 0
    beta = torch.rand(T, nv, device=DEV).to(torch.bfloat16).float()
    return q, k, v, g, beta
