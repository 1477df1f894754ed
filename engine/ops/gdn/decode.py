"""Wrapper for cuda/gdn/decode.cu (K4): the whole GDN decode step of one layer in one launch.

``gdn_decode`` equals, bit for bit, ``causal_conv1d_decode`` -> split q|k|v -> ``gdn_gating`` ->
``recurrent_gated_delta_rule`` -> ``gated_rms_norm`` composed from the CUDA ops of this package (same
rounding points, same fp32 reduction orders). One CTA of 8 warps per (sequence, value head), the
state in registers, the gated norm in the epilogue (the .cu header records the grid variants that
lost and were removed). The Nv / Nk CTAs that share a key head's q|k conv state meet through int32
counters in a per-device buffer: allocated once, zeroed, and left at zero by every launch. Launches
that may run concurrently on different streams must not share it. It has no arms: the state always
lives in registers, fp32, whether the pool stores fp32 or bf16 (``engine.ops.gdn.state``).
"""

from __future__ import annotations

import torch

from engine.ops.compile import (
    as_i32,
    check_cuda,
    f32,
    i32,
    kernel,
    launch,
    ptr,
    tuning_row,
)
from engine.ops.gdn.state import state_type

SRC = "gdn/decode.cu"
D = 128  # dk = dv
CONV_K = 4
COUNTER_CAPACITY = 1 << 16
_COUNTERS: dict[int, torch.Tensor] = {}


def table_row(cc: int | None = None) -> tuple[int, int]:
    """(warps per CTA, CTAs per SM of the register cap): the ``DS_DECODE_TABLE`` row for the device."""
    return tuning_row(SRC, "DS_DECODE_TABLE", cc)


def kernel_name(st: str, cc: int | None = None) -> str:
    """The instantiation for state type ``st`` (``float`` / ``bf16_t``) on sm_``cc`` (default: the
    device): the table row's warps and, for the launch bounds, its CTAs per SM."""
    warps, ctas = table_row(cc)
    return f"gdn_decode_kernel<{warps}, {st}, {ctas}>"


def counters(device: torch.device) -> torch.Tensor:
    """The device's zeroed int32 counter buffer (allocated on first use, never during a capture)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    buf = _COUNTERS.get(idx)
    if buf is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"gdn_decode: the counter buffer of cuda:{idx} would be allocated inside a CUDA graph "
                "capture; call gdn_decode (or engine.ops.gdn.decode.counters) once before capturing"
            )
        buf = torch.zeros(COUNTER_CAPACITY, dtype=torch.int32, device=torch.device("cuda", idx))
        _COUNTERS[idx] = buf
    return buf


def _check_vec(op: str, name: str, t: torch.Tensor, n: int) -> None:
    check_cuda(f"{op} {name}", t)
    if not (t.dtype in (torch.bfloat16, torch.float32) and t.numel() == n and t.is_contiguous()):
        raise ValueError(
            f"{op}: {name} must be a contiguous [{n}] bf16 or fp32 tensor, got {t.dtype} {tuple(t.shape)}"
        )


def _check_rows(op: str, name: str, t: torch.Tensor, shape: tuple[int, int], vec: int) -> None:
    check_cuda(f"{op} {name}", t, torch.bfloat16, 2)
    if tuple(t.shape) != shape:
        raise ValueError(f"{op}: {name} must be {list(shape)}, got {tuple(t.shape)}")
    if not (t.stride(1) == 1 and t.stride(0) % vec == 0 and t.data_ptr() % (2 * vec) == 0):
        raise ValueError(
            f"{op}: {name} needs contiguous rows, {2 * vec}-byte aligned, row stride a multiple of {vec}"
        )


def gdn_decode(
    qkv,
    z,
    b,
    a,
    conv_weight,
    conv_state,
    A_log,
    dt_bias,
    norm_weight,
    eps,
    ssm_state,
    state_slot,
    num_k_heads,
):
    """One decode token per sequence -> y [B, Nv*128] bf16 (gated-RMSNorm output, before out_proj).

    qkv [B, C] bf16 with C = (2 Nk + Nv) * 128, z [B, Nv*128] bf16, b, a [B, Nv] bf16 (all may be
    row-strided column slices of the fused projection); conv_weight [C, 4] bf16; conv_state [S, C, 3]
    bf16 and ssm_state [S, Nv, 128, 128] fp32 or bf16 pools (a bf16 state is rounded once, after the
    step; y comes from the fp32 state), updated in place for slots > 0 (slot <= 0 is
    padding: zero state, pools untouched, the row of y still written); A_log, dt_bias [Nv] and
    norm_weight [128] bf16 or fp32; state_slot [B] int.
    """
    op = "gdn_decode"
    nk = int(num_k_heads)
    check_cuda(f"{op} qkv", qkv, torch.bfloat16, 2)
    B, C = qkv.shape
    _check_rows(op, "qkv", qkv, (B, C), 4)
    if not (nk > 0 and C % D == 0 and C // D > 2 * nk):
        raise ValueError(f"{op}: qkv has {C} channels, Nk = {nk}")
    nv = C // D - 2 * nk
    if nv % nk != 0:
        raise ValueError(f"{op}: Nv = {nv} must be a multiple of Nk = {nk}")
    _check_rows(op, "z", z, (B, nv * D), 4)
    _check_rows(op, "b", b, (B, nv), 1)
    _check_rows(op, "a", a, (B, nv), 1)
    check_cuda(f"{op} conv_weight", conv_weight, torch.bfloat16, 2)
    if not (
        tuple(conv_weight.shape) == (C, CONV_K)
        and conv_weight.is_contiguous()
        and conv_weight.data_ptr() % 16 == 0
    ):
        raise ValueError(
            f"{op}: conv_weight must be contiguous, aligned [{C}, {CONV_K}], got {tuple(conv_weight.shape)}"
        )
    check_cuda(f"{op} conv_state", conv_state, torch.bfloat16, 3)
    if not (
        conv_state.is_contiguous()
        and tuple(conv_state.shape[1:]) == (C, CONV_K - 1)
        and conv_state.data_ptr() % 16 == 0
    ):
        raise ValueError(
            f"{op}: conv_state must be contiguous, aligned [S, {C}, {CONV_K - 1}], "
            f"got {tuple(conv_state.shape)}"
        )
    st = state_type(op, ssm_state)
    if not (
        ssm_state.is_contiguous()
        and tuple(ssm_state.shape[1:]) == (nv, D, D)
        and ssm_state.data_ptr() % 16 == 0
    ):
        raise ValueError(
            f"{op}: ssm_state must be a contiguous aligned [S, {nv}, {D}, {D}], got {tuple(ssm_state.shape)}"
        )
    _check_vec(op, "A_log", A_log, nv)
    _check_vec(op, "dt_bias", dt_bias, nv)
    _check_vec(op, "norm_weight", norm_weight, D)
    check_cuda(f"{op} state_slot", state_slot, dim=1)
    if state_slot.shape[0] != B:
        raise ValueError(f"{op}: state_slot has {state_slot.shape[0]} rows, qkv {B}")
    dev = qkv.device
    for name, t in (("z", z), ("b", b), ("a", a), ("conv_state", conv_state), ("ssm_state", ssm_state)):
        if t.device != dev:
            raise ValueError(f"{op}: {name} is on {t.device}, qkv on {dev}")
    if B * nk > COUNTER_CAPACITY:
        raise ValueError(f"{op}: B * Nk = {B * nk} exceeds the counter capacity {COUNTER_CAPACITY}")
    y = torch.empty((B, nv * D), dtype=torch.bfloat16, device=dev)
    if B == 0:
        return y
    slots = as_i32(state_slot).contiguous()
    cnt = counters(dev)
    flags = (
        (A_log.dtype == torch.bfloat16) * 1
        + (dt_bias.dtype == torch.bfloat16) * 2
        + (norm_weight.dtype == torch.bfloat16) * 4
    )
    args = (
        ptr(qkv),
        i32(qkv.stride(0)),
        ptr(z),
        i32(z.stride(0)),
        ptr(b),
        i32(b.stride(0)),
        ptr(a),
        i32(a.stride(0)),
        ptr(conv_weight),
        ptr(conv_state),
        ptr(A_log),
        ptr(dt_bias),
        ptr(norm_weight),
        f32(eps),
        ptr(ssm_state),
        ptr(slots),
        ptr(cnt),
        ptr(y),
        i32(nk),
        i32(nv),
        i32(flags),
        f32(D**-0.5),
    )
    warps = table_row()[0]
    launch(kernel(SRC, kernel_name(st)), (B * nv,), (32 * warps,), args, pdl=True)
    return y
