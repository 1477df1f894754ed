"""Wrapper for cuda/norm/gated_norm.cu (K5): HF Qwen3_5RMSNormGated over rows of dv = 128."""

from __future__ import annotations

import torch

from engine.ops.compile import arch_params, check_cuda, f32, i32, kernel, launch, output, ptr

SRC = "norm/gated_norm.cu"


def gated_rms_norm(x, z, weight, eps, out=None):
    """x, z [N, dv] bf16 (row strides allowed), weight [dv] bf16 or fp32 -> [N, dv] bf16, written into
    ``out`` (x's shape, contiguous bf16) when given; ``out`` may be x itself (in place)."""
    op = "gated_rms_norm"
    check_cuda(f"{op} x", x, torch.bfloat16)
    check_cuda(f"{op} z", z, torch.bfloat16)
    check_cuda(f"{op} weight", weight)
    dv = x.shape[-1]
    if dv != 128:
        raise ValueError(f"{op}: only dv = 128 is compiled, got {dv}")
    if not (
        weight.dtype in (torch.bfloat16, torch.float32) and weight.numel() == dv and weight.is_contiguous()
    ):
        raise ValueError(f"{op}: weight must be a contiguous [{dv}] bf16/fp32 tensor")
    shape = x.shape
    x2 = x.reshape(-1, dv)
    z2 = z.reshape(-1, dv)
    if x2.shape != z2.shape:
        raise ValueError(f"{op}: x {tuple(x.shape)} and z {tuple(z.shape)} differ")
    if not (
        x2.stride(1) == 1
        and z2.stride(1) == 1
        and x2.stride(0) % 4 == 0
        and z2.stride(0) % 4 == 0
        and x2.data_ptr() % 8 == 0
        and z2.data_ptr() % 8 == 0
    ):
        raise ValueError(f"{op}: rows must be contiguous and 8-byte aligned")
    N = x2.shape[0]
    out = output(op, out, (N, dv), x.dtype, x.device)
    if N == 0:
        return out.reshape(shape)
    warps = arch_params().norm_warps
    wb = "true" if weight.dtype == torch.bfloat16 else "false"
    fn = kernel(SRC, f"gated_rms_norm_kernel<{dv}, {warps}, {wb}>")
    launch(
        fn,
        (-(-N // warps),),
        (warps * 32,),
        (ptr(x2), i32(x2.stride(0)), ptr(z2), i32(z2.stride(0)), ptr(weight), ptr(out), i32(N), f32(eps)),
    )
    return out.reshape(shape)
