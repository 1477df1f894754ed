"""Reference for Ops.argmax: torch's own, the order every backend must reproduce."""

from __future__ import annotations

import torch


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [S, V] -> [S] int64: per row the index of the largest value; the first NaN beats every
    number; ties go to the lowest index."""
    return x.argmax(dim=-1)


def logprobs(
    x: torch.Tensor, targets: torch.Tensor, k: int, rank: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """x [R, V] raw logits (any float dtype), targets [R] int64 in [0, V) -> (chosen [R] fp32, rank [R]
    int64 or None, top_v [R, k] fp32 or None, top_i [R, k] int64 or None), all from
    ``logp = log_softmax(x, dtype=float32)``: chosen = logp[r, targets[r]], rank = the number of entries
    of logp above chosen, plus one (only with ``rank``), and ``logp.topk(k)`` (None when k is 0)."""
    logp = torch.log_softmax(x, dim=-1, dtype=torch.float32)
    chosen = logp.gather(1, targets[:, None].to(torch.int64))
    ranks = (logp > chosen).sum(dim=-1) + 1 if rank else None
    top = logp.topk(k, dim=-1) if k else None
    return chosen[:, 0], ranks, top.values if top else None, top.indices if top else None
