"""The reference of ``Ops.linear``: exactly the ``F.linear`` the model called before the op existed, so
the CPU path and the HF oracle do not move by a bit. The CUDA table may bind the skinny kernel instead
(engine/ops/gemm/cuda.py, arm ``linear.skinny``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> [M, N] in x.dtype (no bias); into ``out`` [M, N] when given.
    F.linear of a 2-D input without bias is ``torch.mm(x, w.t())``, the same GEMM the ``out`` form
    calls (F.linear takes no ``out``)."""
    if out is None:
        return F.linear(x, w)
    return torch.mm(x, w.t(), out=out)
