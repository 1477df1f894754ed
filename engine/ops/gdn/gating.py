"""Wrapper for cuda/gdn/gating.cu: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)."""

from __future__ import annotations

import torch

from engine.ops.compile import check_cuda, i32, kernel, launch, ptr

SRC = "gdn/gating.cu"
THREADS = 256


def gdn_gating(a, b, A_log, dt_bias):
    """a, b [T, Nv] bf16 (rows may be strided) -> (g [T, Nv] fp32, beta [T, Nv] fp32)."""
    op = "gdn_gating"
    check_cuda(f"{op} a", a, torch.bfloat16, 2)
    check_cuda(f"{op} b", b, torch.bfloat16, 2)
    if a.shape != b.shape:
        raise ValueError(f"{op}: a {tuple(a.shape)} and b {tuple(b.shape)} differ")
    if not (a.stride(1) == 1 and b.stride(1) == 1):
        raise ValueError(f"{op}: a and b need contiguous rows")
    T, nv = a.shape
    if not (A_log.numel() == nv and dt_bias.numel() == nv):
        raise ValueError(f"{op}: A_log and dt_bias need {nv} entries")
    # [Nv] fp32 copies are 128 bytes: cheaper than a template per parameter dtype
    a_log = A_log.reshape(nv).to(torch.float32).contiguous()
    dtb = dt_bias.reshape(nv).to(torch.float32).contiguous()
    g = torch.empty((T, nv), dtype=torch.float32, device=a.device)
    beta = torch.empty((T, nv), dtype=torch.float32, device=a.device)
    if T == 0:
        return g, beta
    fn = kernel(SRC, f"gdn_gating_kernel<{THREADS}>")
    launch(
        fn,
        (-(-T * nv // THREADS),),
        (THREADS,),
        (
            ptr(a),
            i32(a.stride(0)),
            ptr(b),
            i32(b.stride(0)),
            ptr(a_log),
            ptr(dtb),
            ptr(g),
            ptr(beta),
            i32(T),
            i32(nv),
        ),
    )
    return g, beta
