"""Wrappers for cuda/norm/fused.cu: the bf16 fused elementwise ops of :mod:`engine.ops` (issue 10).

``add_rms_norm``, ``silu_mul`` and ``qk_norm_rope_kv`` with the exact reference signatures
(engine.ops.norm.fused_reference). Outputs are allocated by torch, launches go on torch's current stream
and nothing synchronises, so every call is CUDA-graph capturable once its kernel is compiled.
"""

from __future__ import annotations

import torch

from engine.ops.attention.reference import _inv_freq
from engine.ops.compile import check_cuda, f32, i32, i64, kernel, launch, output, ptr

SRC = "norm/fused.cu"
SILU_THREADS = 256
QK_THREADS = 128  # the qk kernel's __launch_bounds__


def _rows_ok(t: torch.Tensor) -> bool:
    """Rows of a 2-D bf16 tensor can be read as 16-byte vectors."""
    return t.stride(-1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0


def _weight(op: str, w: torch.Tensor, d: int) -> str:
    """The W_BF16 template argument for a norm weight, after checking it."""
    check_cuda(f"{op} weight", w)
    if not (w.dtype in (torch.bfloat16, torch.float32) and w.numel() == d and w.is_contiguous()):
        raise ValueError(
            f"{op}: weight must be a contiguous [{d}] bf16/fp32 tensor, got {tuple(w.shape)} {w.dtype}"
        )
    if w.data_ptr() % 16 != 0:
        raise ValueError(f"{op}: weight must be 16-byte aligned")
    return "true" if w.dtype == torch.bfloat16 else "false"


def norm_shape(d: int) -> tuple[int, int, int]:
    """(VPT, TPR, ROWS) of add_rms_norm_kernel for a row of d values: TPR threads per row, VPT 16-byte
    vectors per thread, ROWS rows per 128-thread CTA when a row needs at most one warp. Wide rows
    (the hidden size) take one CTA of up to 512 threads so a decode step's few rows still spread out."""
    if not (d % 8 == 0 and d > 0):
        raise ValueError(f"add_rms_norm: the row size must be a multiple of 8, got {d}")
    vec = d // 8
    if vec <= 32:
        if vec & (vec - 1) != 0:
            raise ValueError(f"add_rms_norm: a row of {d} (< 256) must be 8 x a power of two")
        return 1, vec, 128 // vec
    for vpt in range(1, 9):
        if vec % vpt == 0 and (vec // vpt) % 32 == 0 and vec // vpt <= 512:
            return vpt, vec // vpt, 1
    raise ValueError(f"add_rms_norm: no compiled layout for a row of {d} (d / 8 must split into warps)")


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    h_out: torch.Tensor | None = None,
    y_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [N, D] bf16 (row strides allowed) -> (y, h) [N, D] bf16, h = residual + x
    (h is x itself when residual is None, as in the reference). ``h_out`` [N, D] (row strides allowed,
    may be ``residual`` itself: an in-place residual stream) receives h instead of a new tensor, and
    ``y_out`` (contiguous, apart from x, residual and h) receives y."""
    check_cuda("add_rms_norm x", x, torch.bfloat16, dim=2)
    if not _rows_ok(x):
        raise ValueError("add_rms_norm: x rows must be contiguous and 16-byte aligned")
    return _add_rms_norm(x, 0, residual, weight, eps, h_out, y_out)


# the split counts add_rms_norm_partials takes (the NVCC check instantiates both for the 4B)
PARTIAL_SPLITS = (2, 4)


def add_rms_norm_partials(
    parts: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    h_out: torch.Tensor | None = None,
    y_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``add_rms_norm(x, residual, ...)`` with x = bf16(parts.sum(0)): ``parts`` [S, N, D] fp32 contiguous
    (S = 2 or 4), the partial products of a split-K GEMM, summed in split order and rounded once
    (engine/ops/gemm/split_norm.py)."""
    check_cuda("add_rms_norm parts", parts, torch.float32, dim=3)
    if parts.shape[0] not in PARTIAL_SPLITS or not parts.is_contiguous() or parts.data_ptr() % 16:
        raise ValueError(
            f"add_rms_norm: parts must be a contiguous, 16-byte aligned [S, N, D] fp32 tensor with S in "
            f"{PARTIAL_SPLITS}, got {tuple(parts.shape)}"
        )
    if residual is None:
        raise ValueError("add_rms_norm: partial sums need a residual")
    return _add_rms_norm(parts, parts.shape[0], residual, weight, eps, h_out, y_out)


def _add_rms_norm(
    x: torch.Tensor,
    splits: int,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    h_out: torch.Tensor | None,
    y_out: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The launch of add_rms_norm_kernel: x [N, D] bf16 (splits 0) or [splits, N, D] fp32 partials."""
    op = "add_rms_norm"
    n, d = x.shape[-2:]
    if residual is not None:
        check_cuda(f"{op} residual", residual, torch.bfloat16, dim=2)
        if residual.shape != (n, d):
            raise ValueError(f"{op}: residual {tuple(residual.shape)} != x rows {(n, d)}")
        if not _rows_ok(residual):
            raise ValueError(f"{op}: residual rows must be contiguous and 16-byte aligned")
    wb = _weight(op, weight, d)
    vpt, tpr, rows = norm_shape(d)
    if h_out is not None:
        if residual is None:
            raise ValueError(f"{op}: h_out needs a residual (without one, h is x itself)")
        check_cuda(f"{op} h_out", h_out, torch.bfloat16, dim=2)
        if h_out.shape != (n, d) or not _rows_ok(h_out):
            raise ValueError(f"{op}: h_out must be {(n, d)} with contiguous, 16-byte aligned rows")
    y = output(op, y_out, (n, d), torch.bfloat16, x.device)
    h = x if residual is None else h_out if h_out is not None else torch.empty_like(y)
    if n == 0:
        return y, h
    if y_out is not None:
        for name, t in (("x", x if splits == 0 else x.view(-1, d)), ("residual", residual), ("h_out", h_out)):
            if t is not None and _overlaps(y, t):
                raise ValueError(f"{op}: y_out overlaps {name}")
    has_res = "false" if residual is None else "true"
    fn = kernel(SRC, f"add_rms_norm_kernel<{vpt}, {tpr}, {rows}, {has_res}, {wb}, {splits}>")
    res = x if residual is None else residual  # never read without the residual: any valid pointer
    launch(
        fn,
        (-(-n // rows),),
        (tpr * rows,),
        (
            ptr(x),
            i32(x.stride(-2)),
            ptr(res),
            i32(res.stride(0)),
            ptr(weight),
            ptr(y),
            ptr(h),
            i32(h.stride(0)),
            i32(n),
            f32(eps),
        ),
        pdl=True,
    )
    return y, h


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) device bytes a 2-D tensor with unit column stride touches."""
    n, m = t.shape
    return t.data_ptr(), t.data_ptr() + ((n - 1) * t.stride(0) + m) * t.element_size()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def silu_mul(gu: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gu [N, 2I] bf16 (row stride allowed) -> silu(gu[:, :I]) * gu[:, I:] as [N, I] bf16, written into
    ``out`` when given: N x I contiguous values, or an [N, I] view with a row stride, which may be
    ``gu[:, :I]`` itself (in place: the piecewise MLP's activation over its own gate half)."""
    op = "silu_mul"
    check_cuda(f"{op} gu", gu, torch.bfloat16, dim=2)
    n, two_i = gu.shape
    if two_i % 2 != 0:
        raise ValueError(f"{op}: gu's last dim must be even (gate | up), got {two_i}")
    inter = two_i // 2
    if gu.stride(1) != 1:
        raise ValueError(f"{op}: gu rows must be contiguous")
    if out is not None and out.dim() == 2 and tuple(out.shape) == (n, inter) and out.stride(1) == 1:
        check_cuda(f"{op} out", out, torch.bfloat16)  # a row-strided view, used as it is
    else:
        out = output(op, out, (n, inter), gu.dtype, gu.device)
    if n == 0 or inter == 0:
        return out
    in_place = out.data_ptr() == gu.data_ptr() and out.stride(0) == gu.stride(0)
    if _overlaps(out, gu) and not in_place:
        raise ValueError(f"{op}: out overlaps gu other than as its gate half gu[:, :{inter}]")
    vec = 8 if inter % 8 == 0 and _rows_ok(gu) and _rows_ok(out) else 1
    fn = kernel(SRC, f"silu_mul_kernel<{vec}, {SILU_THREADS}>")
    items = n * inter // vec
    launch(
        fn,
        (-(-items // SILU_THREADS),),
        (SILU_THREADS,),
        (ptr(gu), i64(gu.stride(0)), ptr(out), i64(out.stride(0)), i32(n), i32(inter)),
        pdl=True,
    )
    return out


def _heads_ok(t: torch.Tensor) -> bool:
    """[T, heads, D] rows readable as 16-byte vectors at any (token, head)."""
    return t.stride(2) == 1 and t.stride(0) % 8 == 0 and t.stride(1) % 8 == 0 and t.data_ptr() % 16 == 0


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
    """qg [T, H, 2D] (query | gate per head), k, v [T, Hkv, D] bf16 views -> q [T, H, D] contiguous,
    normed and rotated (into ``out`` when given: T * H * D contiguous values, 16-byte aligned); k
    (normed, rotated) and v written to the [NB, bs, Hkv, D] caches."""
    op = "qk_norm_rope_kv"
    check_cuda(f"{op} qg", qg, torch.bfloat16, dim=3)
    check_cuda(f"{op} k", k, torch.bfloat16, dim=3)
    check_cuda(f"{op} v", v, torch.bfloat16, dim=3)
    t, h, d2 = qg.shape
    d = d2 // 2
    hkv = k.shape[1]
    if not (k.shape == (t, hkv, d) and v.shape == (t, hkv, d)):
        raise ValueError(f"{op}: k {tuple(k.shape)} and v {tuple(v.shape)} must both be [{t}, Hkv, {d}]")
    if not (d % 8 == 0 and d // 8 <= 32 and (d // 8) & (d // 8 - 1) == 0):
        raise ValueError(f"{op}: head dim {d} not compiled")
    if not (rotary_dim % 2 == 0 and 0 < rotary_dim <= d):
        raise ValueError(f"{op}: rotary_dim {rotary_dim} must be even, <= {d}")
    for name, x in (("qg", qg), ("k", k), ("v", v)):
        if not _heads_ok(x):
            raise ValueError(f"{op}: {name} heads must be contiguous and 16-byte aligned")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_cuda(f"{op} {name}", c, torch.bfloat16, dim=4)
        if not (c.shape[2:] == (hkv, d) and c.is_contiguous()):
            raise ValueError(
                f"{op}: {name} must be a contiguous [NB, bs, {hkv}, {d}] tensor, got {tuple(c.shape)}"
            )
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{op}: k_cache and v_cache shapes differ")
    wb = _weight(op, q_norm, d)
    if _weight(op, k_norm, d) != wb:
        raise ValueError(f"{op}: q_norm and k_norm must share a dtype")
    if not (positions.shape == (t,) and slot_mapping.shape == (t,)):
        raise ValueError(f"{op}: positions/slot_mapping must be [{t}]")
    pos = positions.to(torch.int64).contiguous()  # no copy for the model's int64 tensors
    slots = slot_mapping.to(torch.int64).contiguous()
    inv_freq = _inv_freq(rotary_dim, float(theta), qg.device)  # the reference's fp32 table, cached
    q = output(op, out, (t, h, d), qg.dtype, qg.device)
    if q.data_ptr() % 16:
        raise ValueError(f"{op}: out must be 16-byte aligned")
    if t == 0:
        return q
    rows = QK_THREADS // (d // 8)
    fn = kernel(SRC, f"qk_norm_rope_kv_kernel<{d}, {wb}>")
    launch(
        fn,
        (t, -(-(h + hkv) // rows)),
        (QK_THREADS,),
        (
            ptr(qg), i32(qg.stride(0)), i32(qg.stride(1)),
            ptr(k), i32(k.stride(0)), i32(k.stride(1)),
            ptr(v), i32(v.stride(0)), i32(v.stride(1)),
            ptr(q_norm), ptr(k_norm), f32(eps),
            ptr(pos), ptr(inv_freq), i32(rotary_dim),
            ptr(k_cache), ptr(v_cache), ptr(slots), ptr(q), i32(h), i32(hkv),
        ),
        pdl=True,
    )  # fmt: skip
    return q
