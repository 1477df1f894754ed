"""The split path of the tensor-core chunked gated delta rule (arm ``prefill.split``).

Two launches instead of :mod:`engine.ops.gdn.chunk`'s one: ``cuda/gdn/chunk_prep.cu`` does every
64-token chunk's dk-side work (norms, gated K K^T and Q K^T, T = (I + A)^-1) for all chunks in
parallel and writes one 34,048-byte entry per (chunk, value head); ``cuda/gdn/chunk_state.cu`` then
walks each sequence's chunks with only the state-side products on its serial chain. It pays where the
one-pass kernel's chain is the whole cost: few sequences of several chunks each (a prefill of one or
two prompts: W2, and W1's 2 x 1,024 steps). With many sequences the one-pass kernel already fills the
device and the entries would be pure extra traffic, so :func:`use_split` keeps it there. The state
pass comes in two forms: one warp per 16-row dv slab of the state (``cuda/gdn/chunk_state.cu``, dv
block from the per-arch row) and, for a single sequence, a warp pair per slab splitting dk
(``cuda/gdn/chunk_state2.cu``, :func:`use_dk2`).

Bench-only arms: ``chunk.dv32`` / ``chunk.dv64`` / ``chunk.dv128`` force the one-warp pass and its
dv block, ``chunk.dk2`` forces the pair pass, ``chunk.o1hi`` as in :mod:`engine.ops.gdn.chunk`.
"""

from __future__ import annotations

import functools

import torch

from engine.ops.compile import f32, i32, kernel, launch, ptr, tuning_row

PREP_SRC = "gdn/chunk_prep.cu"
STATE_SRC = "gdn/chunk_state.cu"
STATE2_SRC = "gdn/chunk_state2.cu"  # the dk-split state pass (use_dk2): dv 32 only
STATE2_SMEM = 96768  # gdns2::Smem::BYTES
DK = DV = 128
DVBS = (32, 64, 128)
ENTRY_BYTES = 34048  # gdnc::Entry::BYTES (static_assert'ed in chunk_prep.cu)
PREP_SMEM = 72448  # gdnp::Smem::BYTES
PREP_THREADS = 256
# Largest entries scratch the split path allocates (a 2,048-token step at 32 value heads takes
# 36 MB); a larger call runs the one-pass kernel rather than hold this much more memory.
MAX_ENTRY_BYTES = 96 << 20


def state_smem_bytes(dvb: int) -> int:
    """Dynamic shared memory of one state-pass CTA (gdns::Smem<DVB>::BYTES, static_assert'ed)."""
    return 68096 + 128 * dvb


def entry_rows(num_tokens: int, num_seqs: int) -> int:
    """Upper bound on sum_b ceil(len_b / 64) = sum_b floor((len_b + 63) / 64) <= floor((T + 63 B) / 64):
    the prep grid's y and the scratch's chunk rows (exact for one sequence)."""
    return (num_tokens + 63 * num_seqs) // 64


def entry_bytes(num_tokens: int, num_seqs: int, nv: int) -> int:
    """Bytes of the prep pass's entries for a call (its scratch, or the workspace it needs)."""
    return entry_rows(num_tokens, num_seqs) * nv * ENTRY_BYTES


def state_params(cc: int | None = None) -> tuple[int, int]:
    """(dv block, fewest chunks): the ``GDN_STATE_TABLE`` row of the newest sm not newer than the device."""
    return tuning_row(STATE_SRC, "GDN_STATE_TABLE", cc)


def use_split(
    num_seqs: int, nv: int, num_tokens: int, max_query_len: int, sms: int, arms, cc: int | None = None
) -> bool:
    """Whether the split path runs: the arm is on, the longest sequence has at least the row's
    fewest chunks, the one-pass kernel would put fewer than two CTAs of dv 128 on each multiprocessor
    (beyond that it fills the device itself), and the scratch stays under ``MAX_ENTRY_BYTES``."""
    if "prefill.split" not in arms or num_seqs * nv >= 2 * sms:
        return False
    if -(-max_query_len // 64) < state_params(cc)[1]:
        return False
    return entry_bytes(num_tokens, num_seqs, nv) <= MAX_ENTRY_BYTES


def pick_dvb(arms: frozenset[str], cc: int | None = None) -> int:
    """dv block of the one-warp-per-slab state pass: forced by a ``chunk.dv*`` arm, else the row's."""
    for d in DVBS:
        if f"chunk.dv{d}" in arms:
            return d
    return state_params(cc)[0]


def use_dk2(num_seqs: int, nv: int, sms: int, arms: frozenset[str]) -> bool:
    """Whether the state pass splits dk over warp pairs (cuda/gdn/chunk_state2.cu, dv 32): forced by
    ``chunk.dk2`` (and ruled out by a ``chunk.dv*`` arm), else when its CTAs fit one per
    multiprocessor. There it halves each warp's products on the chain (H200, one sequence: 67.8 vs
    82.1 us at 1 x 1,024); with more CTAs than multiprocessors the dv-64 pass is as fast or faster
    (2 x 1,024: 89.6 vs 85.0 us; 4 x 512: 91.4 vs 63.8)."""
    if "chunk.dk2" in arms:
        return True
    if any(f"chunk.dv{d}" in arms for d in DVBS):
        return False
    return num_seqs * nv * (DV // 32) <= sms


@functools.cache
def _prep():
    fn = kernel(PREP_SRC, "gdn_chunk_prep_kernel")
    fn.max_dynamic_shared_size_bytes = PREP_SMEM
    return fn


@functools.cache
def _state(dvb: int, o1lo: bool, st: str):
    fn = kernel(STATE_SRC, f"gdn_chunk_state_kernel<{dvb}, {'true' if o1lo else 'false'}, {st}>")
    fn.max_dynamic_shared_size_bytes = state_smem_bytes(dvb)
    return fn


@functools.cache
def _state2(o1lo: bool, st: str):
    fn = kernel(STATE2_SRC, f"gdn_chunk_state2_kernel<{'true' if o1lo else 'false'}, {st}>")
    fn.max_dynamic_shared_size_bytes = STATE2_SMEM
    return fn


def launch_prep(q, k, g, beta, qsl, num_seqs: int, entries, *, nk: int, nv: int) -> None:
    """The prep pass: every chunk's entry into ``entries`` (``entry_rows`` x nv x ENTRY_BYTES bytes)."""
    args: tuple = (ptr(q), ptr(k), ptr(g), ptr(beta), ptr(qsl), i32(num_seqs), ptr(entries), i32(nk), i32(nv))
    args += (i32(q.stride(0)), i32(k.stride(0)), f32(DK**-0.5))
    rows = entry_rows(q.shape[0], num_seqs)
    launch(_prep(), (nk, rows), (PREP_THREADS,), args, shared_mem=PREP_SMEM)


def launch_state(
    q,
    k,
    v,
    entries,
    ssm_state,
    qsl,
    slots,
    hinit,
    out,
    *,
    nk: int,
    nv: int,
    st: str,
    dk2: bool,
    dvb: int,
    o1lo: bool,
) -> None:
    """The state pass over the prep pass's entries: the warp-pair form (``dk2``, dv 32) or the
    one-warp form at dv block ``dvb``."""
    B = slots.shape[0]
    if dk2:
        fn, grid, block, smem = _state2(o1lo, st), (nv * (DV // 32), B), (128,), STATE2_SMEM
    else:
        fn, grid, block = _state(dvb, o1lo, st), (nv * (DV // dvb), B), (dvb * 2,)
        smem = state_smem_bytes(dvb)
    args: tuple = (ptr(q), ptr(k), ptr(v), ptr(entries), ptr(ssm_state), ptr(qsl), ptr(slots), ptr(hinit))
    args += (ptr(out), i32(nk), i32(nv), i32(q.stride(0)), i32(k.stride(0)), i32(v.stride(0)))
    launch(fn, grid, block, args, shared_mem=smem)


def run(
    q,
    k,
    v,
    g,
    beta,
    ssm_state,
    qsl,
    slots,
    hinit,
    out,
    *,
    nk: int,
    nv: int,
    st: str,
    sms: int,
    arms,
    workspace=None,
):
    """Both passes on checked inputs (:func:`engine.ops.gdn.chunk.chunk_gated_delta_rule` checks them
    and makes v 16-byte aligned); ``qsl``, ``slots`` int32 and ``hinit`` uint8 on the device. The
    entries go into ``workspace`` when it is a large enough, 256-byte aligned uint8 CUDA tensor."""
    T, B = q.shape[0], slots.shape[0]
    n = entry_bytes(T, B, nv)
    if (
        workspace is not None
        and workspace.dtype == torch.uint8
        and workspace.is_cuda
        and workspace.is_contiguous()
        and workspace.numel() >= n
        and workspace.data_ptr() % 256 == 0
    ):
        entries = workspace[:n]
    else:
        entries = torch.empty(n, dtype=torch.uint8, device=q.device)
    launch_prep(q, k, g, beta, qsl, B, entries, nk=nk, nv=nv)
    dk2, dvb, o1lo = use_dk2(B, nv, sms, arms), pick_dvb(arms), "chunk.o1hi" not in arms
    args = (q, k, v, entries, ssm_state, qsl, slots, hinit, out)
    launch_state(*args, nk=nk, nv=nv, st=st, dk2=dk2, dvb=dvb, o1lo=o1lo)
    return out
