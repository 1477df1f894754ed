"""Reference compositions of the fused elementwise ops (issue 10): exactly the separate ops the model
called before, in the same order, so the CPU results and the HF oracle do not move by a bit.

The CUDA table replaces each with one bf16 kernel (engine/ops/norm/fused_cuda.py) under an arm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops.attention.reference import apply_rope, write_kv
from engine.ops.gemm.reference import linear
from engine.ops.norm.reference import rms_norm


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    h_out: torch.Tensor | None = None,
    y_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h), h) with ``h = residual + x`` in the model dtype (``h = x`` without a residual).
    ``h_out`` (which may be ``residual`` itself) receives h instead of a new tensor, ``y_out`` y."""
    if residual is None:
        if h_out is not None:
            raise ValueError("add_rms_norm: h_out needs a residual (without one, h is x itself)")
        h = x
    else:
        h = torch.add(residual, x, out=h_out) if h_out is not None else residual + x  # [N, D]
    y = rms_norm(h, weight, eps)
    return (y, h) if y_out is None else (y_out.copy_(y), h)


def linear_add_rms_norm(
    a: torch.Tensor,
    w: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    h_out: torch.Tensor | None = None,
    y_out: torch.Tensor | None = None,
    x_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm(linear(a, w, out=x_out), residual, ...)``: what the model runs without the fused op
    (a mixer's output projection, then the post norm)."""
    x = linear(a, w, out=x_out)
    return add_rms_norm(x, residual, weight, eps, h_out=h_out, y_out=y_out)


def silu_mul(gu: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU's activation on the fused gate|up projection ``[N, 2I]`` -> ``[N, I]`` (into ``out``)."""
    inter = gu.shape[-1] // 2
    return torch.mul(F.silu(gu[..., :inter]), gu[..., inter:], out=out)


def qk_norm_rope_kv(
    qg: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    rotary_dim: int,
    theta: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q/k RMSNorm, partial RoPE and the KV write of a gated-attention layer -> q ``[T, H, D]`` (a
    view of ``out``, T * H * D contiguous values, when given).

    ``qg [T, H, 2D]`` holds each head's query then its gate; only the query half is read here.
    """
    t, h, d2 = qg.shape
    d = d2 // 2
    hkv = k.shape[1]
    q = rms_norm(qg[..., :d].reshape(-1, d), q_norm, eps).reshape(t, h, d)
    kn = rms_norm(k.reshape(-1, d), k_norm, eps).reshape(t, hkv, d)
    q, kn = apply_rope(q, kn, positions, rotary_dim, theta)
    write_kv(kn, v, k_cache, v_cache, slot_mapping)
    return q if out is None else out.view(t, h, d).copy_(q)
