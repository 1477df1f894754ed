"""Wrapper for cuda/attention/paged_attention.cu: paged causal attention on tensor cores.

Same semantics as :func:`engine.ops.reference.paged_attention` (fp32 scores and softmax, output in
bf16, optional output gate) for a mixed varlen batch of decodes and prefill chunks, in one launch
(plus a combine launch when the KV walk is split). See the .cu header for the tiling.

Host-side choices, all from host ints so a call is capturable in a CUDA graph (no ``.item()``, no
sync, every workspace from torch):
- warps per CTA: 1 (16 packed rows) when ``max_query_len * G <= 16`` (decode), else 4 (64 rows);
- KV tile BN and pipeline depth, rows of ``cuda/attention/pa_tiles.cuh``: prefill the ``PA_TILES`` row
  of the device's sm (64 keys at D <= 128, 32 at D = 256; two stages), decode the ``PA_DECODE`` row
  (three stages of 16 KiB on sm_90);
- KV splits: :func:`pick_splits`, a wave model over the grid's upper bound of work items and the
  longest sequence's tile count (``max_seq_len``), capped so the fp32 workspace stays <= 64 MiB.

Tensors (T tokens, B sequences, H = G * Hkv heads, D in {64, 128, 256}, bs in {16, 32, 64}):
q [T, H, D] bf16 (last dim contiguous; copied when rows are not 16-byte aligned),
k_cache / v_cache [NB, bs, Hkv, D] bf16 contiguous, block_table [B, M] int32,
query_start_loc [B+1], seq_lens [B], num_computed [B] int32 (int64 converted),
gate [T, H, D] bf16 with any token / head strides (last dim contiguous) or None -> out [T, H, D] bf16.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from engine.ops.compile import as_i32, f32, i32, kernel, launch, output, ptr, tuning_row

SRC = "attention/paged_attention.cu"
TILES = "attention/pa_tiles.cuh"  # the per-arch tile rows (PA_TILES, PA_DECODE)
HEAD_DIMS = (64, 128, 256)
BLOCK_SIZES = (16, 32, 64)
MAX_SPLITS = 64  # PA_MAX_SPLITS in the .cu
COMBINE = "attention/pa_combine.cuh"
COMBINE_GROUPS = 4  # P in pa_combine.cuh: thread groups per row, each D / 4 threads (a CTA of D)
COMBINE_PER = (1, 4, 16)  # the combine's instantiations: splits per thread group
# fp32 split partials O [splits, T, H, D] + lse: a step's largest transient when it splits. Splits pay
# where few work items leave SMs idle (decode-sized steps, whose partials are small); a step large
# enough to need more than this has work items to spare.
WORKSPACE_BYTES = 16 << 20
LOG2E = 1.4426950408889634
OP = "paged_attention"
# How far (log2 units) a row's softmax max may lag before O is rescaled (the .cu's rescale_slack):
# P <= 2^slack stays well inside bf16's and fp32's range, and the sums' relative error is unchanged.
LAZY_RESCALE_SLACK = 8.0
MAX_RESCALE_SLACK = 16.0


@dataclass(frozen=True)
class Plan:
    """One launch's host-side shape: kernel template arguments, grid and split count."""

    head_dim: int
    tile_n: int  # BN keys per KV tile
    warps: int  # NW: 16 packed (token, head) rows per warp
    stages: int  # K/V tiles in the cp.async ring
    splits: int
    grid: tuple[int, int, int]  # (B * Hkv, query tiles upper bound, splits)

    @property
    def smem(self) -> int:
        return smem_bytes(self.head_dim, self.tile_n, self.warps, self.stages)

    @property
    def name(self) -> str:
        return kernel_name(self.head_dim, self.tile_n, self.warps, self.stages)


def kernel_name(head_dim: int, tile_n: int, warps: int, stages: int) -> str:
    return f"paged_attn_kernel<{head_dim}, {tile_n}, {warps}, {stages}>"


def combine_name(head_dim: int, splits: int) -> str:
    """The combine instantiation for ``splits`` partials: the fewest splits per group that hold them."""
    per = next((n for n in COMBINE_PER if COMBINE_GROUPS * n >= splits), None)
    if per is None:
        raise ValueError(f"{OP}: {splits} splits exceed the combine's {COMBINE_GROUPS * COMBINE_PER[-1]}")
    return f"paged_attn_combine_kernel<{head_dim}, {per}>"


def smem_bytes(head_dim: int, tile_n: int, warps: int, stages: int) -> int:
    """Dynamic shared memory of one CTA: the Q tile plus ``stages`` tiles of K and of V."""
    return (16 * warps + 2 * stages * tile_n) * head_dim * 2


def tile_n(head_dim: int, cc: int | None = None) -> int:
    """Prefill BN: the ``PA_TILES`` row of the newest sm not newer than the device."""
    small, big = tuning_row(TILES, "PA_TILES", cc)
    return big if head_dim == 256 else small


def warps_for(max_query_len: int, group: int) -> int:
    """One warp (16 rows) when every sequence's rows fit in it, as in decode; else four."""
    return 1 if max_query_len * group <= 16 else 4


def tile_shape(head_dim: int, warps: int, cc: int | None = None) -> tuple[int, int, int]:
    """(BN, NW, stages) the .cu instantiates for this head dim and warp count on sm_``cc``."""
    if warps == 1:
        stages, kib = tuning_row(TILES, "PA_DECODE", cc)
        return kib * 1024 // (4 * head_dim), 1, stages
    return tile_n(head_dim, cc), warps, 2


def pick_splits(items: int, kv_tiles: int, slots: int, max_splits: int = MAX_SPLITS) -> int:
    """KV splits per work item: the smallest count minimising waves x (tiles per split + 1 prologue),
    plus one tile's worth for the combine pass when split. ``items`` is the grid's work-item bound,
    ``kv_tiles`` the longest sequence's tile count and ``slots`` the resident CTAs of the device."""
    if not (items >= 1 and kv_tiles >= 1 and slots >= 1):
        raise ValueError(f"{OP}: bad split inputs {items, kv_tiles, slots}")
    best, best_cost = 1, math.inf
    for s in range(1, max(1, min(max_splits, kv_tiles)) + 1):
        waves = -(-items * s // slots)
        cost = waves * (-(-kv_tiles // s) + 1) + (1 if s > 1 else 0)
        if cost < best_cost:
            best, best_cost = s, cost
    return best


def make_plan(
    num_tokens: int,
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_query_len: int,
    max_seq_len: int,
    slots_for,
    shape_for,
    splits: int | None = None,
) -> Plan:
    """The launch for these host ints. ``shape_for(warps)`` gives (BN, NW, stages) and
    ``slots_for(shape)`` the CTAs of that kernel resident on the device."""
    group = num_heads // num_kv_heads
    bn, nw, stages = shape = shape_for(warps_for(max_query_len, group))
    q_tiles = -(-max_query_len * group // (16 * nw))
    items = num_seqs * num_kv_heads * q_tiles
    if splits is None:
        cap = max(1, WORKSPACE_BYTES // max(1, num_tokens * num_heads * (head_dim + 1) * 4))
        splits = pick_splits(items, -(-max_seq_len // bn), slots_for(shape), min(MAX_SPLITS, cap))
    if not (1 <= splits <= MAX_SPLITS):
        raise ValueError(f"{OP}: splits must be in [1, {MAX_SPLITS}], got {splits}")
    return Plan(head_dim, bn, nw, stages, splits, (num_seqs * num_kv_heads, q_tiles, splits))


@functools.cache
def _function(name: str, smem: int):
    fn = kernel(SRC, name)
    if smem > 0:
        fn.max_dynamic_shared_size_bytes = smem  # > 48 KB needs the opt-in
    return fn


def device_slots(device_index: int, head_dim: int):
    """``slots_for`` of :func:`make_plan` on this device."""

    def slots_for(shape: tuple[int, int, int]) -> int:
        bn, nw, stages = shape
        return _slots(
            device_index, kernel_name(head_dim, bn, nw, stages), smem_bytes(head_dim, bn, nw, stages), 32 * nw
        )

    return slots_for


@functools.cache
def _slots(device_index: int, name: str, smem: int, threads: int) -> int:
    """Resident CTAs of this kernel on the whole device (shared memory, registers, block limit)."""
    import cupy

    attrs = cupy.cuda.Device(device_index).attributes
    fn = _function(name, smem)
    per_sm = min(
        attrs.get("MaxSharedMemoryPerMultiprocessor", 101376) // (smem + 1024),
        attrs.get("MaxRegistersPerMultiprocessor", 65536) // max(1, fn.num_regs * threads),
        attrs.get("MaxBlocksPerMultiprocessor", 16),
    )
    return max(1, per_sm) * attrs["MultiProcessorCount"]


def _check_inputs(q, k_cache, v_cache, block_table, query_start_loc, seq_lens, num_computed, gate, scale):
    if q.dim() != 3:
        raise ValueError(f"{OP}: q must be [T, H, D], got shape {tuple(q.shape)}")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"{OP}: q must be bfloat16, got {q.dtype}")
    T, H, D = q.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"{OP}: head dim {D} not in {HEAD_DIMS}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 4:
            raise ValueError(f"{OP}: {name} must be [NB, bs, Hkv, D], got shape {tuple(c.shape)}")
        if c.dtype != torch.bfloat16:
            raise ValueError(f"{OP}: {name} must be bfloat16, got {c.dtype}")
        if not c.is_contiguous():
            raise ValueError(f"{OP}: {name} must be contiguous")
    kshape, vshape = tuple(k_cache.shape), tuple(v_cache.shape)
    if kshape != vshape:
        raise ValueError(f"{OP}: k_cache {kshape} and v_cache {vshape} differ")
    _, bs, hkv, dk = k_cache.shape
    if dk != D:
        raise ValueError(f"{OP}: k_cache head dim {dk} != q head dim {D}")
    if bs not in BLOCK_SIZES:
        raise ValueError(f"{OP}: k_cache block size {bs} not in {BLOCK_SIZES}")
    if not (hkv >= 1 and H % hkv == 0):
        raise ValueError(f"{OP}: q heads {H} not a multiple of k_cache kv heads {hkv}")
    if block_table.dim() != 2:
        raise ValueError(f"{OP}: block_table must be [B, M], got shape {tuple(block_table.shape)}")
    B = block_table.shape[0]
    meta = (
        ("query_start_loc", query_start_loc, B + 1),
        ("seq_lens", seq_lens, B),
        ("num_computed", num_computed, B),
    )
    for name, t, n in meta:
        if not (t.dim() == 1 and t.shape[0] == n):
            raise ValueError(f"{OP}: {name} must be [{n}], got shape {tuple(t.shape)}")
    for name, t, _ in (("block_table", block_table, 0), *meta):
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{OP}: {name} must be int32 or int64, got {t.dtype}")
    if gate is not None:
        gshape = tuple(gate.shape)
        if gshape != (T, H, D):
            raise ValueError(f"{OP}: gate must be {(T, H, D)} like q, got {gshape}")
        if gate.dtype != torch.bfloat16:
            raise ValueError(f"{OP}: gate must be bfloat16, got {gate.dtype}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{OP}: scale must be a positive finite float, got {scale}")
    tensors = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table)]
    tensors += [("query_start_loc", query_start_loc), ("seq_lens", seq_lens), ("num_computed", num_computed)]
    tensors += [("gate", gate)] if gate is not None else []
    for name, t in tensors:
        if not t.is_cuda:
            raise ValueError(f"{OP}: {name} must be a CUDA tensor, got device {t.device}")
        if t.device != q.device:
            raise ValueError(f"{OP}: {name} is on {t.device}, q on {q.device}")
    return T, H, D, B, hkv, bs


def _rows16(t: torch.Tensor) -> torch.Tensor:
    """``t`` when its last dim is contiguous and every row starts 16-byte aligned (cp.async), else a copy."""
    if t.stride(2) == 1 and t.stride(1) % 8 == 0 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0:
        return t
    return t.contiguous() if t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


def paged_attention(
    q,
    k_cache,
    v_cache,
    block_table,
    query_start_loc,
    seq_lens,
    num_computed,
    scale,
    max_query_len,
    max_seq_len,
    *,
    gate=None,
    out=None,
    splits: int | None = None,
    shape: tuple[int, int, int] | None = None,
    rescale_slack: float = 0.0,
):
    """Causal attention of ``q [T, H, D]`` over each sequence's paged KV -> ``[T, H, D]`` bf16, written
    into ``out`` (contiguous bf16, T x H x D values) when given.

    ``max_query_len`` / ``max_seq_len`` must bound every sequence's new tokens / cached length (they
    size the grid and the split count; a CUDA graph captured at a bound replays any batch within it).
    ``splits`` forces the KV split count and ``shape`` the (BN, NW, stages) instantiation (tests and
    benches); None picks them from the device. ``rescale_slack`` (log2 units, 0 to
    ``MAX_RESCALE_SLACK``) lets a row's softmax max lag the true max by that much before O is rescaled:
    0 is the plain online softmax; the arm ``attention.lazy_rescale`` passes ``LAZY_RESCALE_SLACK``.
    """
    T, H, D, B, hkv, bs = _check_inputs(
        q, k_cache, v_cache, block_table, query_start_loc, seq_lens, num_computed, gate, float(scale)
    )
    if int(max_query_len) < 1:
        raise ValueError(f"{OP}: max_query_len must be >= 1, got {max_query_len}")
    if int(max_seq_len) < 1:
        raise ValueError(f"{OP}: max_seq_len must be >= 1, got {max_seq_len}")
    if not (0.0 <= float(rescale_slack) <= MAX_RESCALE_SLACK):
        raise ValueError(f"{OP}: rescale_slack must be in [0, {MAX_RESCALE_SLACK}], got {rescale_slack}")
    out = output(OP, out, (T, H, D), torch.bfloat16, q.device)
    if T == 0 or B == 0:
        return out
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()

    def shape_for(nw: int) -> tuple[int, int, int]:
        return tile_shape(D, nw) if shape is None else shape

    plan = make_plan(
        T, B, H, hkv, D, int(max_query_len), int(max_seq_len), device_slots(dev, D), shape_for, splits
    )
    tiles = plan.grid[1]
    if tiles > 65535:
        raise ValueError(f"{OP}: max_query_len {max_query_len} needs {tiles} query tiles (> 65535)")
    q = _rows16(q)
    if gate is not None and not (
        gate.stride(2) == 1
        and gate.stride(1) % 4 == 0
        and gate.stride(0) % 4 == 0
        and gate.data_ptr() % 8 == 0
    ):
        gate = gate.contiguous()  # the epilogues load 2 / 4 gate values per access
    bt = as_i32(block_table)
    bt = bt if bt.stride(1) == 1 else bt.contiguous()
    qsl, sl, nc = (as_i32(t).contiguous() for t in (query_start_loc, seq_lens, num_computed))
    if plan.splits > 1:
        o_part = torch.empty((plan.splits, T, H, D), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((plan.splits, T, H), dtype=torch.float32, device=q.device)
    gptr = ptr(gate) if gate is not None else ptr_null()
    gs_t, gs_h = (gate.stride(0), gate.stride(1)) if gate is not None else (0, 0)
    launch(
        _function(plan.name, plan.smem),
        plan.grid,
        (32 * plan.warps,),
        (
            ptr(q),
            ptr(k_cache),
            ptr(v_cache),
            ptr(bt),
            ptr(qsl),
            ptr(sl),
            ptr(nc),
            gptr if plan.splits == 1 else ptr_null(),
            ptr(out),
            ptr(o_part) if plan.splits > 1 else ptr_null(),
            ptr(lse_part) if plan.splits > 1 else ptr_null(),
            i32(hkv),
            i32(H // hkv),
            i32(q.stride(0)),
            i32(q.stride(1)),
            i32(gs_t),
            i32(gs_h),
            i32(bt.stride(0)),
            i32(bs.bit_length() - 1),
            i32(plan.splits),
            i32(T),
            f32(float(scale) * LOG2E),
            f32(float(rescale_slack)),
        ),
        shared_mem=plan.smem,
        pdl=True,
    )
    if plan.splits > 1:
        launch(
            _function(combine_name(D, plan.splits), 0),
            (T * H,),
            (COMBINE_GROUPS * (D // 4),),
            (ptr(o_part), ptr(lse_part), gptr, ptr(out), i32(T * H), i32(H), i32(plan.splits))
            + (i32(gs_t), i32(gs_h)),
            pdl=True,
        )
    return out


def ptr_null() -> object:
    import numpy

    return numpy.uint64(0)
