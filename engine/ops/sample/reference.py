"""Reference for Ops.argmax: torch's own, the order every backend must reproduce."""

from __future__ import annotations

import torch


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [S, V] -> [S] int64: per row the index of the largest value; the first NaN beats every
    number; ties go to the lowest index."""
    return x.argmax(dim=-1)
