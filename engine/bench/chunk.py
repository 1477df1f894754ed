"""``python -m engine.bench.chunk``: the tensor-core chunked GDN prefill (engine.ops.gdn.chunk)
beside fla's Triton ``chunk_gated_delta_rule`` and the token-recurrent CUDA kernel it replaces.

Shapes: W1 (32 sequences x 1,024 tokens) and one 32,768-token sequence, Nk 16, Nv 32, dk = dv = 128,
every sequence continuing from a state. Timing and table rows as engine/bench/kernels.py (CUDA-graph
replays, median); TFLOP/s counts the recurrence's 6 T Nv d^2 useful FLOPs for every implementation
(the chunk form executes ~3.4x that on tensor cores with its hi/lo splits). fla is called as
bench_prefill calls it: q/k pre-expanded to Nv heads, its own L2 norm, final state out.
``--split``: the split path (arm ``prefill.split``) against the one-pass kernel, alternated, on the
few-sequence shapes it is for (SPLIT_SHAPES).
"""

from __future__ import annotations

import sys

import torch

from engine.bench import kernels as B
from engine.ops import reference as ref
from engine.ops.gdn import chunk, chunk_split
from engine.ops.gdn import recurrent as delta

NK, NV, D = B.NK, B.NV, B.D
SHAPES = ((32, 1024), (1, 32768))
# --split: the few-sequence shapes the split path is for (W2's prompt, W1's prefill steps, a full
# 2,048-token step of one prompt, and shorter prompts), then the one-pass kernel's own shapes
SPLIT_SHAPES = ((1, 1024), (2, 1024), (1, 2048), (4, 512), (8, 256), (1, 32768), (32, 1024))


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


def split_ab(nseq: int, L: int, rounds: int = 3) -> None:
    """The split path (and its dk-split state pass, ``chunk.dk2``) against the one-pass kernel on one
    shape: errors against the fp32 reference, then ``rounds`` timings of each in rotated order and an
    A/A pair of the one-pass kernel; prints each time and the ratios of the medians."""
    import statistics

    split = frozenset({"prefill.split"})
    sides = {"one-pass": frozenset(), "split": split, "split dk2": split | {"chunk.dk2"}}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    T = nseq * L
    on = chunk_split.use_split(nseq, NV, T, L, sms, split)
    q, k, v, g, beta, st, qsl, slots, hinit = inputs(nseq, L, seed=1)
    s_ref = st.clone()
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, s_ref, qsl, slots, hinit, L)
    live = slots.long().tolist()
    errs = []
    for name, arms in sides.items():
        s = st.clone()
        got = chunk.chunk_gated_delta_rule(q, k, v, g, beta, s, qsl, slots, hinit, L, arms=arms)
        errs.append(f"{name} out {B.rel(got, want):.2e} state {max(B.rel(s[i], s_ref[i]) for i in live):.2e}")
    path = "on" if on else "off: one-pass"
    print(f"  split {nseq}x{L} (split path {path}): rel " + "; ".join(errs), flush=True)
    nbytes = T * (2 * NK * D * 2 + 2 * NV * D * 2 + 2 * NV * 4) + nseq * NV * D * D * 4 * 2

    def timed(arms):
        call = lambda i: (
            lambda: chunk.chunk_gated_delta_rule(  # noqa: E731
                q, k, v, g, beta, st, qsl, slots, hinit, L, arms=arms
            )
        )
        return B.time_graph(call, nbytes, max_r=2, reps=5 if T > 8192 else 20)

    names = list(sides)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(timed(sides[name]))
    aa = [timed(frozenset()), timed(frozenset())]
    med = {n: statistics.median(t) for n, t in times.items()}
    line = ", ".join(f"{n} {' '.join(f'{x:.1f}' for x in times[n])} us" for n in names)
    ratios = ", ".join(f"{n} / one-pass {med[n] / med['one-pass']:.3f}" for n in names[1:])
    print(f"  split {nseq}x{L}: {line}; {ratios}; A/A {aa[1] / aa[0]:.3f}", flush=True)
    for n in names:
        B.row("gdn prefill (chunk op)", f"{nseq}x{L}", f"{n} (median)", med[n], nbytes, 6 * T * NV * D * D)


def split_parts(nseq: int, L: int) -> None:
    """The split path's two passes timed apart (``--split-parts``): the prep pass alone, then the state
    pass alone at each dv block over the entries the prep pass left."""
    q, k, v, g, beta, st, qsl, slots, hinit = inputs(nseq, L)
    T = nseq * L
    rows = chunk_split.entry_rows(T, nseq)
    entries = torch.empty(rows * NV * chunk_split.ENTRY_BYTES, dtype=torch.uint8, device=B.DEV)
    out = torch.empty(T, NV, D, dtype=torch.bfloat16, device=B.DEV)
    qs, sl, hi = qsl.int(), slots.int(), hinit.to(torch.uint8)
    vv = chunk._vec16(v)

    def prep():
        chunk_split.launch_prep(q, k, g, beta, qs, nseq, entries, nk=NK, nv=NV)

    def state(dk2, dvb=32):
        kw = {"nk": NK, "nv": NV, "st": "float", "dk2": dk2, "dvb": dvb, "o1lo": True}
        chunk_split.launch_state(q, k, vv, entries, st, qs, sl, hi, out, **kw)

    auto = chunk_split.pick_dvb(frozenset())
    us = B.time_graph(lambda i: prep, 0, max_r=2)
    print(f"  parts {nseq}x{L}: prep pass {us:.1f} us ({rows * NK} CTAs)", flush=True)
    us = B.time_graph(lambda i: lambda: state(True), 0, max_r=2)
    print(f"  parts {nseq}x{L}: state pass dk2 (dv32) {us:.1f} us ({NV * 4 * nseq} CTAs)", flush=True)
    for dvb in chunk_split.DVBS:
        us = B.time_graph(lambda i, dvb=dvb: lambda: state(False, dvb), 0, max_r=2)
        ctas = NV * (D // dvb) * nseq
        print(f"  parts {nseq}x{L}: state pass dv{dvb} {us:.1f} us ({ctas} CTAs){' (auto)' * (dvb == auto)}")


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
    if "--split-parts" in sys.argv:
        for nseq, L in SPLIT_SHAPES[:5]:
            split_parts(nseq, L)
        return 0
    if "--split" in sys.argv:  # the split path's shapes only
        chunk_split.MAX_ENTRY_BYTES = 1 << 30  # let 1 x 32,768 take it too (its scratch: 0.56 GB)
        first = len(B.ROWS)
        for nseq, L in SPLIT_SHAPES:
            split_ab(nseq, L)
        B.print_table(B.ROWS[first:])
        return 0
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
