"""RMSNorm flavours of Qwen3.5, in HF's exact operation order.

Both accept any leading shape (``[N, D]`` in the contract; ``[T, H, D]`` works too because the
norm is over the last dim only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm (``Qwen3_5RMSNorm``): fp32 normalise, multiply by ``1 + w`` in fp32, then cast.

    The cast comes after the multiply (Qwen order, not Llama's cast-then-multiply).
    """
    xf = x.float()  # [N, D]
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = y * (1.0 + weight.float())
    return y.to(x.dtype)


def gated_rms_norm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """GDN output norm (``Qwen3_5RMSNormGated``): plain ``w``, norm first, then ``* silu(z)``; written
    into ``out`` (x's shape) when given.

    The weight multiply happens on the normalised value cast back to ``x.dtype`` (a bf16 multiply in a
    bf16 model, promoted if the weight is fp32), the gate multiply in fp32; HF does exactly this.
    """
    in_dtype = x.dtype
    h = x.to(torch.float32)  # [N, dv]
    var = h.pow(2).mean(-1, keepdim=True)  # [N, 1]
    h = h * torch.rsqrt(var + eps)
    h = weight * h.to(in_dtype)
    h = h * F.silu(z.to(torch.float32))
    return h.to(in_dtype) if out is None else out.copy_(h.view(out.shape))
