"""``Ops.linear_add_rms_norm`` on CUDA (arm ``linear.split_norm``): a mixer's output projection whose
output only feeds the residual add and the post-attention RMSNorm, with the split-K reduction moved into
that norm.

At decode batches of 9-64 rows cuBLAS runs the 2,560-row projections of the 4B (GDN out_proj, attention
o_proj) as a split-K GEMM plus a separate reduce kernel. Here the same product runs as an explicit
split-K: a strided batched GEMM over S slices of K (views, no copy) writing S fp32 partial products,
which ``add_rms_norm_kernel`` sums in split order and rounds once to bf16 (the projection's output)
before the residual add it does anyway: one launch less per layer and a GEMM without the reduce pass
(session 39, docs/bench-evidence/2026-12-04-s39.md: 10.3 -> 8.4-8.6 us per call at M = 32). The sum
differs from cuBLAS's own in fp32 order only, then both round once.

Outside that range (fewer rows: the skinny GEMM has no reduce; more rows: no split-K to remove), for
other dtypes and layouts, or on a torch without ``bmm(..., out_dtype=)``, it composes the table's
``linear`` and ``add_rms_norm``, exactly what the model runs without the arm.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.ops.norm import fused_cuda

MIN_ROWS, MAX_ROWS = 9, 64  # measured: 16, 32, 64 rows; below 9 the skinny GEMM (no split-K) runs
# the most slices the norm takes that divide K into whole 64-element blocks
SPLITS = tuple(sorted(fused_cuda.PARTIAL_SPLITS, reverse=True))
_HAS_BMM_DTYPE = hasattr(torch.ops.aten.bmm, "dtype")  # torch >= 2.8


def split_count(a: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None) -> int:
    """How many K slices the split path takes for ``linear(a, w)`` + the add (0: compose instead)."""
    if not _HAS_BMM_DTYPE or residual is None:
        return 0
    if a.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or a.dim() != 2 or w.dim() != 2:
        return 0
    m, k = a.shape
    if not (MIN_ROWS <= m <= MAX_ROWS and w.shape[1] == k and a.is_cuda and w.device == a.device):
        return 0
    if a.stride(1) != 1 or a.stride(0) % 8 or a.data_ptr() % 16 or not w.is_contiguous() or w.data_ptr() % 16:
        return 0
    try:
        fused_cuda.norm_shape(w.shape[0])
    except ValueError:
        return 0
    return next((s for s in SPLITS if k % (64 * s) == 0), 0)


def linear_add_rms_norm(
    a: torch.Tensor,
    w: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    h_out: torch.Tensor | None = None,
    y_out: torch.Tensor | None = None,
    x_out: torch.Tensor | None = None,
    *,
    linear: Callable,
    add_rms_norm: Callable,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h) of ``add_rms_norm(linear(a, w), residual, weight, eps, h_out, y_out)``; ``x_out`` receives
    the projection when the op composes (a piecewise graph's static buffer), and is left alone by the
    split path, which never materialises it. ``linear`` and ``add_rms_norm`` are the table's ops."""
    s = split_count(a, w, residual)
    if s == 0:
        x = linear(a, w, out=x_out)
        return add_rms_norm(x, residual, weight, eps, h_out=h_out, y_out=y_out)
    m, k = a.shape
    n, kc = w.shape[0], k // s
    a_parts = a.as_strided((s, m, kc), (kc, a.stride(0), 1))  # slice j: a[:, j kc : (j + 1) kc]
    w_parts = w.as_strided((s, kc, n), (kc, 1, k))  # slice j: w[:, j kc : (j + 1) kc]^T
    parts = torch.bmm(a_parts, w_parts, out_dtype=torch.float32)  # [s, m, n]
    assert residual is not None  # split_count is 0 without one
    return fused_cuda.add_rms_norm_partials(parts, residual, weight, eps, h_out=h_out, y_out=y_out)
