"""Wrapper for cuda/gemm/skinny.cu: ``linear`` with the reference signature, the skinny tensor-core
kernel for decode-sized inputs (M <= 8 rows), ``F.linear`` (cuBLAS) for everything else.

The kernel reads the weights exactly once with no split-K reduction launch; the output is allocated by
torch, the launch goes on torch's current stream and nothing synchronises, so a call is CUDA-graph
capturable once its instantiation is compiled (the model's warm-up forward does that before capture).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.ops.compile import device_cc, i32, kernel, launch, ptr, sm_count, tuning_row
from engine.ops.gemm import reference

SRC = "gemm/skinny.cu"
TABLE = "SKINNY_TABLE"
ROW_COUNTS = (1, 2, 4, 8)  # the instantiated row counts; a launch takes the smallest that holds M
MAX_ROWS = ROW_COUNTS[-1]


@dataclass(frozen=True)
class Plan:
    """One launch: ``skinny_gemm_kernel<rows, tiles, warps, unroll>`` on ``blocks`` CTAs."""

    rows: int
    tiles: int
    warps: int
    unroll: int
    blocks: int

    @property
    def name(self) -> str:
        return f"skinny_gemm_kernel<{self.rows}, {self.tiles}, {self.warps}, {self.unroll}>"


def why_not(x: torch.Tensor, w: torch.Tensor) -> str | None:
    """Why the skinny kernel cannot take ``F.linear(x, w)`` (None when it can)."""
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        return f"dtypes {x.dtype} / {w.dtype} (the kernel takes bfloat16)"
    if x.dim() != 2 or w.dim() != 2:
        return f"shapes {tuple(x.shape)} / {tuple(w.shape)} (x [M, K], w [N, K])"
    m, k = x.shape
    n = w.shape[0]
    if not 1 <= m <= MAX_ROWS:
        return f"{m} rows (the kernel takes 1 to {MAX_ROWS})"
    if w.shape[1] != k or n == 0:
        return f"x [{m}, {k}] and w {tuple(w.shape)} do not match"
    if k % 8 != 0 or n * k >= 2**31 or m * n >= 2**31:
        return f"K = {k} (a multiple of 8 and int32 sizes only)"
    if not (x.is_contiguous() and w.is_contiguous()):
        return "x or w not contiguous"
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        return "x or w not 16-byte aligned"
    if not (x.is_cuda and w.device == x.device):
        return f"devices {x.device} / {w.device} (needs both on one CUDA device)"
    return None


def make_plan(
    m: int,
    n: int,
    k: int,
    sms: int,
    row: tuple[int, int],
    *,
    tiles: int = 1,
    warps: int | None = None,
    unroll: int | None = None,
) -> Plan:
    """The launch for [m, k] x [n, k] on a device of ``sms`` SMs; ``row`` = (warps, iters) from the
    SKINNY_TABLE. A wide N (>= 2 CTAs per SM) streams with UNROLL 1; a narrow N (the 2560-row
    projections) takes the smallest UNROLL in 1, 2, 4 that leaves each warp at most ``iters``
    iterations of K, so its few CTAs keep enough loads in flight. Keywords override (the bench)."""
    table_warps, iters = row
    warps = table_warps if warps is None else warps
    rows = next(r for r in ROW_COUNTS if r >= m)
    blocks = -(-n // (16 * tiles))
    if unroll is None:
        unroll = 1
        if blocks < 2 * sms:
            while unroll < 4 and -(-k // (warps * 32 * unroll)) > iters:
                unroll *= 2
    return Plan(rows, tiles, warps, unroll, blocks)


def plan_for(x: torch.Tensor, w: torch.Tensor) -> Plan:
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    m, k = x.shape
    return make_plan(m, w.shape[0], k, sm_count(dev), tuning_row(SRC, TABLE, device_cc()))


def skinny(x: torch.Tensor, w: torch.Tensor, plan: Plan | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> y [M, N] bf16 through the kernel; the inputs must pass :func:`why_not`.
    ``plan`` overrides the table's launch (the bench's sweep)."""
    why = why_not(x, w)
    if why is not None:
        raise ValueError(f"skinny linear: {why}")
    return _launch(x, w, plan_for(x, w) if plan is None else plan)


def _launch(x: torch.Tensor, w: torch.Tensor, plan: Plan, out: torch.Tensor | None = None) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out  # [M, N]
    args = (ptr(x), ptr(w), ptr(y), i32(m), i32(n), i32(k))
    launch(kernel(SRC, plan.name), (plan.blocks,), (32 * plan.warps,), args, pdl=True)
    return y


def linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``Ops.linear``: x [M, K] @ w [N, K]^T -> [M, N] in x.dtype; the skinny kernel where it applies,
    ``F.linear`` elsewhere (more rows, other dtypes, strided or misaligned inputs, the CPU). With
    ``out`` (a graph's static buffer) the same choice writes into it: the kernel when ``out`` is a
    contiguous, 16-byte aligned [M, N] bf16 tensor, else the reference's ``torch.mm``; so a decode
    graph's lm_head into its logits buffer computes what the eager step's does, bit for bit."""
    if why_not(x, w) is not None:
        return F.linear(x, w) if out is None else reference.linear(x, w, out=out)
    if out is not None and not _fits(out, x, w):
        return reference.linear(x, w, out=out)
    return _launch(x, w, plan_for(x, w), out)


def _fits(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the kernel can write ``out`` as its [M, N] output."""
    return (
        out.dtype == x.dtype
        and tuple(out.shape) == (x.shape[0], w.shape[0])
        and out.is_contiguous()
        and out.data_ptr() % 16 == 0
        and out.device == x.device
    )
