"""Wrappers for cuda/gdn/recurrent.cu: the gated delta rule for prefill (varlen) and decode.

Both ops run the same register-resident recurrent kernel; see the .cu header for the math and the
thread layout. The default engine uses it for neither (decode: the fused K4 kernel in ``decode.py``;
prefill: the tensor-core kernel in ``chunk.py``); it stays as their non-default arms and as the
simplest correct kernel to compare them with. The arms it once had lost and were removed
(docs/bench-evidence/2026-11-29-s2-gdn-kernels.md): staging the state through shared memory
(1.3x slower at batch 32) and 16-byte output stores (no measurable effect). The state pool may be
fp32 or bf16 (``engine.ops.gdn.state``): one instantiation each, fp32 math in both.
"""

from __future__ import annotations

import torch

from engine.ops.compile import (
    arch_params,
    as_i32,
    as_u8,
    check_cuda,
    f32,
    i32,
    kernel,
    launch,
    output,
    ptr,
)
from engine.ops.gdn.state import STATE_TYPES, state_type

SRC = "gdn/recurrent.cu"
DK = DV = 128


def _check(op, q, k, v, g, beta, ssm_state):
    check_cuda(f"{op} q", q, torch.bfloat16, 3)
    check_cuda(f"{op} k", k, torch.bfloat16, 3)
    check_cuda(f"{op} v", v, torch.bfloat16, 3)
    state_type(op, ssm_state)
    T, nk, dk = k.shape
    nv, dv = v.shape[1], v.shape[2]
    if q.shape != k.shape:
        raise ValueError(f"{op}: q {tuple(q.shape)} and k {tuple(k.shape)} differ")
    if v.shape[0] != T:
        raise ValueError(f"{op}: v has {v.shape[0]} tokens, k {T}")
    if not (dk == DK and dv == DV):
        raise ValueError(f"{op}: only dk = dv = {DK} is compiled, got {dk}, {dv}")
    if nv % nk != 0:
        raise ValueError(f"{op}: Nv = {nv} must be a multiple of Nk = {nk}")
    for name, t, d in (("q", q, dk), ("k", k, dk)):
        if not (t.stride(2) == 1 and t.stride(1) == d and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0):
            raise ValueError(
                f"{op}: {name} needs contiguous 16-byte aligned heads and a token stride multiple of 8"
            )
    if not (v.stride(2) == 1 and v.stride(1) == dv and v.stride(0) % 4 == 0 and v.data_ptr() % 8 == 0):
        raise ValueError(f"{op}: v needs contiguous 8-byte aligned heads and a token stride multiple of 4")
    if not (g.shape == (T, nv) and beta.shape == (T, nv)):
        raise ValueError(f"{op}: g and beta must be [T={T}, Nv={nv}]")
    if not (ssm_state.is_contiguous() and tuple(ssm_state.shape[1:]) == (nv, dk, dv)):
        raise ValueError(
            f"{op}: ssm_state must be contiguous [S, {nv}, {dk}, {dv}], got {tuple(ssm_state.shape)}"
        )
    g = g.to(torch.float32).contiguous()
    beta = beta.to(torch.float32).contiguous()
    check_cuda(f"{op} g", g)
    return T, nk, nv, g, beta


def _check_varlen(op, query_start_loc, state_slot, has_initial_state) -> int:
    """B, after checking the varlen batch description: query_start_loc [B+1], has_initial_state [B]."""
    B = state_slot.shape[0]
    if not (query_start_loc.shape[0] == B + 1 and has_initial_state.shape[0] == B):
        raise ValueError(f"{op}: query_start_loc [B+1], has_initial_state [B] must match state_slot [B={B}]")
    return B


def _launch(q, k, v, g, beta, ssm_state, qsl, slots, hinit, out, B, nk, nv):
    p = arch_params()
    cols_cta = (32 // p.delta_rg) * 4 * p.delta_warps
    st = STATE_TYPES[ssm_state.dtype]
    name = f"gdn_delta_kernel<{DK}, {DV}, {p.delta_rg}, {p.delta_warps}, {st}>"
    fn = kernel(SRC, name)
    null = 0
    launch(
        fn,
        (nv * (DV // cols_cta), B),
        (p.delta_warps * 32,),
        (
            ptr(q),
            ptr(k),
            ptr(v),
            ptr(g),
            ptr(beta),
            ptr(ssm_state),
            ptr(qsl) if qsl is not None else _u64(null),
            ptr(slots),
            ptr(hinit) if hinit is not None else _u64(null),
            ptr(out),
            i32(nk),
            i32(nv),
            i32(q.stride(0)),
            i32(k.stride(0)),
            i32(v.stride(0)),
            f32(DK**-0.5),
        ),
    )


def _u64(x: int):
    import numpy

    return numpy.uint64(x)


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    ssm_state,
    query_start_loc,
    state_slot,
    has_initial_state,
    max_query_len,
    out=None,
    workspace=None,
):
    """q, k [T, Nk, 128], v [T, Nv, 128] bf16, g, beta [T, Nv] fp32 -> o [T, Nv, 128] bf16 (into ``out``,
    T x Nv x 128 contiguous values, when given; ``workspace`` is not needed here).

    ssm_state [S, Nv, 128, 128] fp32 or bf16 is read (has_initial_state) and written by slot, slots > 0
    only; a bf16 state is rounded once, when the sequence's last token is done.
    """
    op = "chunk_gated_delta_rule"
    T, nk, nv, g, beta = _check(op, q, k, v, g, beta, ssm_state)
    B = _check_varlen(op, query_start_loc, state_slot, has_initial_state)
    out = output(op, out, (T, nv, DV), v.dtype, v.device)
    if B == 0:
        return out
    _launch(
        q,
        k,
        v,
        g,
        beta,
        ssm_state,
        as_i32(query_start_loc),
        as_i32(state_slot),
        as_u8(has_initial_state),
        out,
        B,
        nk,
        nv,
    )
    return out


def recurrent_gated_delta_rule(q, k, v, g, beta, ssm_state, state_slot):
    """One token per sequence: q, k [B, Nk, 128], v [B, Nv, 128] -> o [B, Nv, 128] bf16; state (fp32
    or bf16) by slot."""
    op = "recurrent_gated_delta_rule"
    B, nk, nv, g, beta = _check(op, q, k, v, g, beta, ssm_state)
    if state_slot.shape[0] != B:
        raise ValueError(f"{op}: state_slot has {state_slot.shape[0]} rows, q {B}")
    out = torch.empty((B, nv, DV), dtype=v.dtype, device=v.device)
    if B == 0:
        return out
    _launch(
        q,
        k,
        v,
        g,
        beta,
        ssm_state,
        None,
        as_i32(state_slot),
        None,
        out,
        B,
        nk,
        nv,
    )
    return out
