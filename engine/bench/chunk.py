"""``python -m engine.bench.chunk``: the tensor-core chunked GDN prefill (engine.ops.gdn.chunk)
beside fla's Triton ``chunk_gated_delta_rule`` and the token-recurrent CUDA kernel it replaces.

Shapes: W1 (32 sequences x 1,024 tokens) and one 32,768-token sequence, Nk 16, Nv 32, dk = dv = 128,
every sequence continuing from a state. Timing and table rows as engine/bench/kernels.py (CUDA-graph
replays, median); TFLOP/s counts the recurrence's 6 T Nv d^2 useful FLOPs for every implementation
(the chunk form executes ~3.4x that on tensor cores with its hi/lo splits). fla is called as
bench_prefill calls it: q/k pre-expanded to Nv heads, its own L2 norm, final state out.
"""

from __future__ import annotations

import sys

import torch

from engine.bench import kernels as B
from engine.ops import reference as ref
from engine.ops.gdn import chunk
from engine.ops.gdn import recurrent as delta

NK, NV, D = B.NK, B.NV, B.D
SHAPES = ((32, 1024), (1, 32768))


def inputs(nseq: int, L: int, seed: int = 0):
    torch.manual_seed(seed)
    T = nseq * L
    qsl, hinit = B.prefill_batch(nseq, L)
    buf = B.bf16(T, (2 * NK + NV) * D)  # the model's fused projection layout: strided q/k/v views
    q, k = buf[:, : NK * D].view(T, NK, D), buf[:, NK * D : 2 * NK * D].view(T, NK, D)
    v = buf[:, 2 * NK * D :].view(T, NV, D)
    g = -torch.rand(T, NV, device=B.DEV) * 0.3
    beta = torch.rand(T, NV, device=B.DEV)
    st = torch.randn(nseq + 1, NV, D, D, device=B.DEV) * 0.1
    slots = torch.arange(1, nseq + 1, dtype=torch.int32, device=B.DEV)
    return q, k, v, g, beta, st, qsl, slots, hinit


def check(nseq: int, L: int, fla=None) -> None:
    q, k, v, g, beta, st, qsl, slots, hinit = inputs(nseq, L, seed=1)
    s1, s2 = st.clone(), st.clone()
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, s1, qsl, slots, hinit, L)
    got = chunk.chunk_gated_delta_rule(q, k, v, g, beta, s2, qsl, slots, hinit, L)
    live = slots.long()
    st_err = max(B.rel(s2[s], s1[s]) for s in live.tolist())
    print(
        f"  check chunk {nseq}x{L}: out rel {B.rel(got, want):.2e}, worst state slot rel {st_err:.2e}",
        flush=True,
    )
    if fla is not None:
        fo, fs = B.fla_chunk(fla, q, k, v, g, beta, st[live].contiguous(), qsl)()
        fo_err, fs_err = B.rel(fo[0], want), B.rel(fs, s1[live])
        print(f"  check fla   {nseq}x{L}: out rel {fo_err:.2e}, state rel {fs_err:.2e}", flush=True)


def bench(fla) -> list[tuple]:
    """Rows (engine.bench.kernels.ROWS format) for both shapes: chunk arms and the recurrent kernel, then
    fla last (its first call autotunes)."""
    first = len(B.ROWS)
    for nseq, L in SHAPES:
        _bench_shape(None, nseq, L)
    if fla is not None:
        for nseq, L in SHAPES:
            _bench_shape(fla, nseq, L)
    return B.ROWS[first:]


def _bench_shape(fla, nseq: int, L: int) -> None:
    T = nseq * L
    q, k, v, g, beta, st, qsl, slots, hinit = inputs(nseq, L)
    nbytes = T * (2 * NK * D * 2 + 2 * NV * D * 2 + 2 * NV * 4) + nseq * NV * D * D * 4 * 2
    flops = 6 * T * NV * D * D
    shape = f"{nseq}x{L}"
    if fla is not None:
        call = B.fla_chunk(fla, q, k, v, g, beta, st[slots.long()].contiguous(), qsl)
        us = B.time_graph(lambda i: call, nbytes, max_r=2)
        B.row("gdn prefill (chunk op)", shape, "fla chunk (Triton, q/k pre-expanded)", us, nbytes, flops)
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    auto = chunk.pick_dvb(nseq * NV, sms, frozenset())
    arm_sets = [frozenset(), frozenset({"chunk.o1hi"})]
    arm_sets += [frozenset({f"chunk.dv{d}"}) for d in chunk.DVBS if d != auto]
    for arms in arm_sets:
        name = "+".join(sorted(arms)) or f"auto dv{auto}"
        us = B.time_graph(
            lambda i, arms=arms: (
                lambda: chunk.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, L, arms=arms)
            ),
            nbytes,
            max_r=2,
        )
        B.row("gdn prefill (chunk op)", shape, f"cuda tensor-core {name}", us, nbytes, flops)
    us = B.time_graph(
        lambda i: lambda: delta.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, L),
        nbytes,
        max_r=2,
        reps=5 if nseq == 1 else 20,
    )
    B.row("gdn prefill (chunk op)", shape, "cuda recurrent-form fp32 (old)", us, nbytes, flops)


MARKS = (
    "wait Q (sync0)",
    "O1 = P Q^T",
    "wait K,V (syncK)",
    "norms, cumsum, coefs",
    "K K^T, Q K^T + epilogue",
    "sync2 + issue Q",
    "inverse T_jj (warps 0-1)",
    "X = P K^T, R",
    "sync3",
    "forward substitution",
    "state update",
    "sync5 + issue K,V",
    "O2 + store",
)


def profile(nseq: int, L: int) -> None:
    """Per-phase clock64 cycles of the profile build (warps 0-1 also invert the diagonal blocks)."""
    import numpy as np

    q, k, v, g, beta, st, qsl, slots, hinit = inputs(nseq, L)
    arms = frozenset({"chunk.profile"})
    dvb = chunk.pick_dvb(nseq * NV, torch.cuda.get_device_properties(0).multi_processor_count, arms)
    chunk.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, L, arms=arms)  # compile
    chunk.profile_marks(dvb, reset=True)
    torch.cuda.synchronize()
    chunk.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, L, arms=arms)
    torch.cuda.synchronize()
    m = chunk.profile_marks(dvb).astype(np.float64)  # [cta, chunk, warp, mark]
    nw = dvb // 16
    nch = min(32, -(-L // 64))
    body = m[:, 1 : nch - 1, :nw, :14]  # skip the first and last chunk
    d = np.diff(body, axis=-1)  # [cta, chunk, warp, 13]
    per_chunk = np.diff(m[:, 1 : nch - 1, 0, 0], axis=1).mean()
    print(f"  profile {nseq}x{L} dv{dvb}: {per_chunk:.0f} cycles per chunk (CTA, warp 0)", flush=True)
    for i, name in enumerate(MARKS):
        print(
            f"    {name:<28}{d[..., :2, i].mean():>8.0f} (warps 0-1){d[..., 2:, i].mean():>8.0f} (others)",
            flush=True,
        )


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    fla = B.load_fla()
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    for dv in chunk.DVBS:
        fn = chunk._function(dv, True)
        regs, local = fn.num_regs, fn.local_size_bytes
        print(f"  gdn_chunk_kernel<{dv}, true>: {regs} regs, {local} B local", flush=True)
    for nseq, L in SHAPES:
        check(nseq, L, fla if "--check-fla" in sys.argv else None)
    if "--profile" in sys.argv:
        for nseq, L in SHAPES:
            profile(nseq, L)
    rows = bench(fla)
    B.print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
