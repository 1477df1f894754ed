"""Wrappers for cuda/conv/conv.cu: causal depthwise conv1d + SiLU (prefill and decode).

Arms: ``conv.k4`` (width-4 specialisation, taps unrolled), ``conv.chunk8`` (8 tokens per thread;
without it each thread computes one token), ``conv.vec4`` (the prefill kernel takes 4 channels per
thread instead of 8: about half the registers, twice the resident warps). ``conv.postconv_tile16``
(16 tokens per thread) lost to conv.chunk8 + conv.k4 (505 vs 461 us at W1) and was removed.
"""

from __future__ import annotations

import torch

from engine.ops.compile import (
    aligned16,
    arch_params,
    as_i32,
    as_u8,
    check_cuda,
    i32,
    kernel,
    launch,
    output,
    ptr,
)

SRC = "conv/conv.cu"
VEC = 8  # channels per thread (one 16-byte vector)
KMAX = 8


def _check_common(
    op: str, x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor
) -> tuple[int, int]:
    check_cuda(f"{op} x", x, torch.bfloat16, 2)
    check_cuda(f"{op} weight", weight, torch.bfloat16, 2)
    check_cuda(f"{op} conv_state", conv_state, torch.bfloat16, 3)
    C, K = weight.shape
    if not weight.is_contiguous():
        raise ValueError(f"{op}: weight [C, K] must be contiguous")
    if not (2 <= K <= KMAX):
        raise ValueError(f"{op}: conv width {K} outside [2, {KMAX}]")
    if x.shape[1] != C:
        raise ValueError(f"{op}: x has {x.shape[1]} channels, weight {C}")
    if C % VEC != 0:
        raise ValueError(f"{op}: channels {C} must be a multiple of {VEC}")
    if not (x.stride(1) == 1 and x.stride(0) % VEC == 0 and aligned16(x)):
        raise ValueError(f"{op}: x rows must be contiguous, 16-byte aligned, row stride a multiple of {VEC}")
    if not (conv_state.is_contiguous() and tuple(conv_state.shape[1:]) == (C, K - 1)):
        raise ValueError(
            f"{op}: conv_state must be contiguous [S, {C}, {K - 1}], got {tuple(conv_state.shape)}"
        )
    return C, K


def _tok(arms: frozenset[str]) -> int:
    return 8 if "conv.chunk8" in arms else 1


def _vec(arms: frozenset[str]) -> int:
    return 4 if "conv.vec4" in arms else VEC


def _kt(arms: frozenset[str], K: int) -> int:
    return 4 if ("conv.k4" in arms and K == 4) else 0


def causal_conv1d_prefill(
    x,
    weight,
    conv_state,
    query_start_loc,
    state_slot,
    has_initial_state,
    max_query_len,
    out=None,
    *,
    arms: frozenset[str] = frozenset({"conv.chunk8"}),
):
    """x [T, C] bf16 -> [T, C] bf16 (into ``out``, T x C contiguous values, when given); conv_state
    [S, C, K-1] updated in place for slots > 0."""
    op = "causal_conv1d_prefill"
    C, K = _check_common(op, x, weight, conv_state)
    B = state_slot.shape[0]
    if not (query_start_loc.shape[0] == B + 1 and has_initial_state.shape[0] == B):
        raise ValueError(f"{op}: query_start_loc [B+1], has_initial_state [B] must match state_slot [B={B}]")
    out = output(op, out, (x.shape[0], C), x.dtype, x.device)
    if x.shape[0] == 0 or B == 0 or max_query_len <= 0:
        return out
    qsl, slots, hinit = as_i32(query_start_loc), as_i32(state_slot), as_u8(has_initial_state)
    threads = arch_params().conv_threads
    tok, vec = _tok(arms), _vec(arms)
    fn = kernel(SRC, f"conv_prefill_kernel<{_kt(arms, K)}, {tok}, {threads}, {vec}>")
    gx = -(-C // (VEC * threads))
    launch(
        fn,
        (-(-C // (vec * threads)), -(-max_query_len // tok), B),
        (threads,),
        (
            ptr(x),
            i32(x.stride(0)),
            ptr(weight),
            ptr(conv_state),
            ptr(qsl),
            ptr(slots),
            ptr(hinit),
            ptr(out),
            i32(C),
            i32(K),
        ),
    )
    upd = kernel(SRC, f"conv_state_update_kernel<{threads}>")
    launch(
        upd,
        (gx, B),
        (threads,),
        (ptr(x), i32(x.stride(0)), ptr(conv_state), ptr(qsl), ptr(slots), ptr(hinit), i32(C), i32(K)),
    )
    return out


def causal_conv1d_decode(
    x, weight, conv_state, state_slot, *, arms: frozenset[str] = frozenset({"conv.chunk8"})
):
    """x [B, C] bf16 -> [B, C] bf16; shifts x into conv_state[slot] for slots > 0."""
    op = "causal_conv1d_decode"
    C, K = _check_common(op, x, weight, conv_state)
    B = x.shape[0]
    if state_slot.shape[0] != B:
        raise ValueError(f"{op}: state_slot has {state_slot.shape[0]} rows, x {B}")
    out = torch.empty((B, C), dtype=x.dtype, device=x.device)
    if B == 0:
        return out
    slots = as_i32(state_slot)
    threads = arch_params().conv_threads
    fn = kernel(SRC, f"conv_decode_kernel<{_kt(arms, K)}, {threads}>")
    launch(
        fn,
        (-(-C // (VEC * threads)), B),
        (threads,),
        (
            ptr(x),
            i32(x.stride(0)),
            ptr(weight),
            ptr(conv_state),
            ptr(slots),
            ptr(out),
            i32(C),
            i32(C),
            i32(K),
        ),
    )
    return out
