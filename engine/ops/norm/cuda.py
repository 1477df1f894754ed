"""Wrapper for cuda/norm/gated_norm.cu (K5): HF Qwen3_5RMSNormGated over rows of dv = 128."""

from __future__ import annotations

import torch

from engine.ops.compile import arch_params, check_cuda, f32, i32, kernel, launch, output, ptr

SRC = "norm/gated_norm.cu"


def _rows(op: str, name: str, t: torch.Tensor, dv: int) -> tuple[torch.Tensor, int, int]:
    """(tensor, stride, heads) addressing ``t``'s rows of ``dv`` values as the kernel does: row r at
    (r // heads) * stride + (r % heads) * dv. [N, dv] with a row stride has heads 1; [T, H, dv] with
    its heads dv apart (the GDN gate: a [T, Nv, dv] view of the fused projection) keeps H, so it is
    read where it lies; any other layout is reshaped to rows (a copy where it must)."""
    if t.dim() == 3 and (t.stride(1) == dv or t.shape[1] == 1):
        heads = t.shape[1]
    else:
        t, heads = (t if t.dim() == 2 else t.reshape(-1, dv)), 1
    stride = t.stride(0)
    if not (t.stride(-1) == 1 and stride % 4 == 0 and t.data_ptr() % 8 == 0):
        raise ValueError(f"{op}: {name} rows must be contiguous and 8-byte aligned")
    return t, stride, heads


def _aligned16(t: torch.Tensor, stride: int) -> bool:
    return t.data_ptr() % 16 == 0 and stride % 8 == 0


def gated_rms_norm(x, z, weight, eps, out=None, *, per_lane: int = 8):
    """x, z [N, dv] (row strides allowed) or [T, H, dv] (token strides allowed) bf16, weight [dv] bf16
    or fp32 -> x's shape bf16, written into ``out`` (N * dv contiguous values) when given; ``out`` may
    be x itself (in place).

    ``per_lane`` 8: two rows per warp, 16-byte loads (``gated_rms_norm2_kernel``) wherever x, z, out
    and the weight are 16-byte aligned, else (or with 4) one row per warp; both give the same bits."""
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
    if z.shape[-1] != dv or x.numel() != z.numel():
        raise ValueError(f"{op}: x {tuple(x.shape)} and z {tuple(z.shape)} differ")
    x2, xs, xh = _rows(op, "x", x, dv)
    z2, zs, zh = _rows(op, "z", z, dv)
    N = x.numel() // dv
    out = output(op, out, (N, dv), x.dtype, x.device)
    if N == 0:
        return out.reshape(shape)
    if per_lane not in (4, 8):
        raise ValueError(f"{op}: per_lane must be 4 or 8, got {per_lane}")
    warps = arch_params().norm_warps
    wb = "true" if weight.dtype == torch.bfloat16 else "false"
    args = (ptr(x2), i32(xs), i32(xh), ptr(z2), i32(zs), i32(zh), ptr(weight), ptr(out), i32(N), f32(eps))
    two = per_lane == 8 and _aligned16(x2, xs) and _aligned16(z2, zs)
    if two and out.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0:
        launch(
            kernel(SRC, f"gated_rms_norm2_kernel<{dv}, {warps}, {wb}>"),
            (-(-N // (2 * warps)),),
            (warps * 32,),
            args,
        )
    else:
        launch(
            kernel(SRC, f"gated_rms_norm_kernel<{dv}, {warps}, {wb}>"), (-(-N // warps),), (warps * 32,), args
        )
    return out.reshape(shape)
