"""Wrapper for cuda/gdn/chunk.cu: the chunked gated delta rule (varlen prefill) on tensor cores.

Same signature, semantics and input checks as :func:`engine.ops.gdn.recurrent.chunk_gated_delta_rule`
(the token-recurrent fp32 kernel this replaces); see the .cu header for the math, the precision
scheme (bf16 hi/lo operand splits) and the pipelining. One CTA per (sequence, value head, dv block);
the dv block is the largest of the per-arch ``GDN_CHUNK_TABLE`` range that still gives at least one
CTA per multiprocessor, so few long sequences split dv (each CTA recomputing the dk-side work).

Arms (bench / A-B only): ``chunk.dv32`` / ``chunk.dv64`` / ``chunk.dv128`` force the dv block;
``chunk.o1hi`` takes the inter-chunk output product Q S with the state's bf16 hi part only (64 fewer
mma per warp and chunk; output error grows to ~2.5e-3 when a large initial state dominates);
``chunk.profile`` runs a build with per-phase clock64 marks (:func:`profile_marks`); ``prefill.split``
(a kernel arm of the model) hands few-sequence calls to the two-pass split path
(:mod:`engine.ops.gdn.chunk_split`), where the dv arms force the state pass's block. Every variant is
built for an fp32 and a bf16 state pool (``engine.ops.gdn.state``).
"""

from __future__ import annotations

import functools

import torch

from engine.ops.compile import (
    as_i32,
    as_u8,
    device_cc,
    f32,
    i32,
    kernel,
    launch,
    output,
    ptr,
    read_source,
    sm_count,
    tuning_row,
)
from engine.ops.gdn import chunk_split
from engine.ops.gdn.recurrent import _check, _check_varlen
from engine.ops.gdn.state import STATE_TYPES

SRC = "gdn/chunk.cu"
DK = DV = 128
DVBS = (32, 64, 128)


def chunk_params(cc: int | None = None) -> tuple[int, int]:
    """(dvb_max, dvb_min): the ``GDN_CHUNK_TABLE`` row of the newest sm not newer than the device."""
    return tuning_row(SRC, "GDN_CHUNK_TABLE", cc)


def smem_bytes(dvb: int) -> int:
    """Dynamic shared memory of one CTA (Smem<DVB>::BYTES in the .cu, static_assert'ed there)."""
    return 72256 + 128 * dvb


def pick_dvb(num_ctas_full: int, sms: int, arms: frozenset[str]) -> int:
    """dv block: forced by an arm, else the largest in range with >= one CTA per multiprocessor."""
    for d in DVBS:
        if f"chunk.dv{d}" in arms:
            return d
    dvb, dvb_min = chunk_params()
    while dvb > dvb_min and num_ctas_full * (DV // dvb) < sms:
        dvb //= 2
    return dvb


@functools.cache
def _function(dvb: int, o1lo: bool, st: str = "float"):
    fn = kernel(SRC, f"gdn_chunk_kernel<{dvb}, {'true' if o1lo else 'false'}, {st}>")
    fn.max_dynamic_shared_size_bytes = smem_bytes(dvb)  # > 48 KB needs the opt-in
    return fn


@functools.cache
def _profile_build(dvb: int, st: str = "float"):
    """(module, function) of the GDN_CHUNK_PROFILE build (bench only, never on the serving path)."""
    import cupy

    name = f"gdn_chunk_kernel<{dvb}, true, {st}>"
    opts = ("-std=c++17", f"-DDS_SM={device_cc()}", "-DGDN_CHUNK_PROFILE")
    mod = cupy.RawModule(code=read_source(SRC), options=opts, name_expressions=[name])
    fn = mod.get_function(name)
    fn.max_dynamic_shared_size_bytes = smem_bytes(dvb)
    return mod, fn


def profile_marks(dvb: int, reset: bool = False):
    """The profile build's clock64 marks as int64 numpy [64 CTAs, 32 chunks, 8 warps, 16 marks]."""
    import cupy

    mod, _ = _profile_build(dvb)
    n = 64 * 32 * 8 * 16
    arr = cupy.ndarray((n,), dtype=cupy.int64, memptr=mod.get_global("gdnc_prof"))
    if reset:
        arr.fill(0)
        return None
    return arr.get().reshape(64, 32, 8, 16)


def _vec16(t: torch.Tensor) -> torch.Tensor:
    """``t`` if its heads are contiguous and every token row is 16-byte aligned (cp.async), else a copy."""
    if t.stride(2) == 1 and t.stride(1) == t.shape[2] and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0:
        return t
    return t.contiguous() if t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


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
    *,
    arms: frozenset[str] = frozenset(),
    out=None,
    workspace=None,
):
    """q, k [T, Nk, 128], v [T, Nv, 128] bf16, g, beta [T, Nv] fp32 -> o [T, Nv, 128] bf16 (into ``out``,
    T x Nv x 128 contiguous values, when given).

    ssm_state [S, Nv, 128, 128] fp32 or bf16 is read (has_initial_state) and written by slot, slots > 0
    only; the state stays fp32 across the chunks, a bf16 pool gets it rounded once at the end.
    ``max_query_len`` (a host int) only decides whether the split path runs (``prefill.split``:
    :mod:`engine.ops.gdn.chunk_split`); each CTA walks its own sequence's chunks. ``workspace`` (uint8,
    256-byte aligned) holds the split path's chunk entries when it is large enough (a CUDA graph's
    static memory), else they are allocated.
    """
    op = "chunk_gated_delta_rule"
    T, nk, nv, g, beta = _check(op, q, k, v, g, beta, ssm_state)
    B = _check_varlen(op, query_start_loc, state_slot, has_initial_state)
    out = output(op, out, (T, nv, DV), v.dtype, v.device)
    if B == 0:
        return out
    v = _vec16(v)
    qsl, slots, hinit = as_i32(query_start_loc), as_i32(state_slot), as_u8(has_initial_state)
    sms = sm_count(v.device.index or 0)
    st = STATE_TYPES[ssm_state.dtype]
    if "chunk.profile" not in arms and chunk_split.use_split(B, nv, T, int(max_query_len), sms, arms):
        kw = {"nk": nk, "nv": nv, "st": st, "sms": sms, "arms": arms, "workspace": workspace}
        return chunk_split.run(q, k, v, g, beta, ssm_state, qsl, slots, hinit, out, **kw)
    dvb = pick_dvb(B * nv, sms, arms)
    if "chunk.profile" in arms:
        fn = _profile_build(dvb, st)[1]
    else:
        fn = _function(dvb, "chunk.o1hi" not in arms, st)
    launch(
        fn,
        (nv * (DV // dvb), B),
        (dvb * 2,),
        (
            ptr(q),
            ptr(k),
            ptr(v),
            ptr(g),
            ptr(beta),
            ptr(ssm_state),
            ptr(qsl),
            ptr(slots),
            ptr(hinit),
            ptr(out),
            i32(nk),
            i32(nv),
            i32(q.stride(0)),
            i32(k.stride(0)),
            i32(v.stride(0)),
            f32(DK**-0.5),
        ),
        shared_mem=smem_bytes(dvb),
    )
    return out
