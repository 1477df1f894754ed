"""Wrapper for cuda/gdn/gating.cu: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)."""

from __future__ import annotations

import torch

from engine.ops.compile import check_cuda, i32, kernel, launch, ptr

SRC = "gdn/gating.cu"
THREADS = 256


def gdn_gating(a, b, A_log, dt_bias):
    """a, b [T, Nv] bf16 (rows may be strided), A_log, dt_bias [Nv] bf16 or fp32 ->
    (g [T, Nv] fp32, beta [T, Nv] fp32)."""
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
    check_cuda(f"{op} A_log", A_log)
    check_cuda(f"{op} dt_bias", dt_bias)
    flags = []
    for name, p in (("A_log", A_log), ("dt_bias", dt_bias)):
        if p.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"{op}: {name} must be bf16 or fp32, got {p.dtype}")
        flags.append("true" if p.dtype == torch.bfloat16 else "false")
    # read in their own dtypes (the model's parameters, contiguous already): no widening launches
    a_log, dtb = A_log.reshape(nv).contiguous(), dt_bias.reshape(nv).contiguous()
    g = torch.empty((T, nv), dtype=torch.float32, device=a.device)
    beta = torch.empty((T, nv), dtype=torch.float32, device=a.device)
    if T == 0:
        return g, beta
    fn = kernel(SRC, f"gdn_gating_kernel<{THREADS}, {flags[0]}, {flags[1]}>")
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
