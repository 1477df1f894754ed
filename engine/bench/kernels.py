"""``python -m engine.bench.kernels``: correctness at W1 shapes, then timings of the CUDA GDN kernels and
arms beside fla's Triton kernels (when ``fla`` imports) and the torch reference. The fused decode
(K4) and tensor-core prefill benches live in ``bench_decode.py`` / ``bench_chunk.py`` and run here too
(``--only decode_fused`` / ``--only prefill_tc``).

W1 shapes: Qwen3.5-4B GDN layer (Nk 16, Nv 32, dk = dv = 128, 8192 conv channels); prefill
32 x 1,024 tokens; decode at batch 1, 8, 32, 64. Timing: each measured region is captured R times
into one CUDA graph with R different input sets (and state slots), so consecutive calls never find
their inputs in L2; CUDA events around graph replays, median of the replays, divided by R.
Ceilings: 4.21 TB/s device copy, 780 TFLOP/s bf16 (measured on the H200, docs/BENCHMARKS.md "Floors").
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from engine.ops import reference as ref
from engine.ops.conv import cuda as conv
from engine.ops.gdn import gating
from engine.ops.gdn import recurrent as delta
from engine.ops.norm import cuda as norm

COPY_BW = 4.21e12
BF16_FLOPS = 780e12
NK, NV, D, C = 16, 32, 128, 8192
L2_BYTES = 60 << 20
DEV = "cuda"


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def replay_us(calls, reps: int = 20) -> float:
    """us per call of ``calls`` (zero-arg callables) captured back to back in one CUDA graph, median of
    ``reps`` replays; each call runs once first (compiles, autotunes) outside the capture."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / len(calls))
    return statistics.median(times)


def time_graph(make_call, bytes_per_call: int, reps: int = 20, max_r: int = 64) -> float:
    """us per call. ``make_call(i)`` returns a zero-arg callable using input set i; enough input sets
    that one replay streams at least 4x the L2."""
    r = max(2, min(max_r, -(-4 * L2_BYTES // max(bytes_per_call, 1))))
    return replay_us([make_call(i) for i in range(r)], reps)


def time_eager(call, reps: int = 5) -> float:
    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        call()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


ROWS: list[tuple[str, str, str, float, float, str]] = []


def row(op: str, shape: str, impl: str, us: float, nbytes: float = 0.0, flops: float = 0.0) -> None:
    bw = nbytes / (us * 1e-6) if nbytes else 0.0
    fr = flops / (us * 1e-6) if flops else 0.0
    note = f"{bw / 1e12:.2f} TB/s = {bw / COPY_BW:.0%} copy" if nbytes else ""
    if flops:
        note += f"{'; ' if note else ''}{fr / 1e12:.1f} TFLOP/s = {fr / BF16_FLOPS:.1%} bf16"
    ROWS.append((op, shape, impl, us, bw, note))
    print(f"  {op:<28}{shape:<18}{impl:<34}{us:>10.1f} us  {note}", flush=True)


def load_fla():
    """fla's gated-delta-rule ops module (``pip install fla-core``), or None with a printed reason."""
    try:
        import fla.ops.gated_delta_rule as fla
    except Exception as e:  # noqa: BLE001 - any import failure means no peer to compare
        print(f"fla not available ({type(e).__name__}: {e}); timing without it")
        return None
    return fla


def print_table(rows) -> None:
    """The rows as one Markdown table (what the evidence files quote)."""
    print("\n| op | shape | impl | us | TB/s | note |\n|---|---|---|---|---|---|")
    for op, shape, impl, us, bw, note in rows:
        print(f"| {op} | {shape} | {impl} | {us:.1f} | {bw / 1e12:.2f} | {note} |")


def fla_recurrent(fla, q, k, v, g, beta, init):
    """fla's fused_recurrent_gated_delta_rule for one decode token per sequence (q, k already
    expanded to the value heads; its own L2 norm): a zero-argument call for ``time_graph``."""
    return lambda: fla.fused_recurrent_gated_delta_rule(
        q[:, None],
        k[:, None],
        v[:, None],
        g=g[:, None],
        beta=beta[:, None],
        scale=D**-0.5,
        initial_state=init,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )


def fla_chunk(fla, q, k, v, g, beta, init, qsl):
    """fla's chunk_gated_delta_rule over a varlen batch (q, k expanded to the value heads, its own L2
    norm): a zero-argument call returning (o [1, T, Nv, D], final states)."""
    qe = q.repeat_interleave(NV // NK, dim=1)[None]
    ke = k.repeat_interleave(NV // NK, dim=1)[None]
    ve = v.contiguous()[None]
    cu = qsl.long()
    return lambda: fla.chunk_gated_delta_rule(
        qe,
        ke,
        ve,
        g[None],
        beta[None],
        scale=D**-0.5,
        initial_state=init,
        output_final_state=True,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
    )


def bf16(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(torch.bfloat16)


def prefill_batch(nseq: int, seqlen: int):
    qsl = torch.arange(0, nseq + 1, dtype=torch.int32, device=DEV) * seqlen
    return qsl, torch.ones(nseq, dtype=torch.bool, device=DEV)


def bench_conv(fla_ok: bool) -> None:
    nseq, L = 32, 1024
    T = nseq * L
    qsl, hinit = prefill_batch(nseq, L)
    w = bf16(C, 4, scale=0.5)
    r_sets = 2
    xs = [bf16(T, C) for _ in range(r_sets)]
    st = bf16(nseq * r_sets + 1, C, 3)
    slot_sets = [
        torch.arange(1 + i * nseq, 1 + (i + 1) * nseq, dtype=torch.int32, device=DEV) for i in range(r_sets)
    ]
    # correctness at W1 shape
    s1, s2 = st.clone(), st.clone()
    want = ref.causal_conv1d_prefill(xs[0], w, s1, qsl, slot_sets[0], hinit, L)
    got = conv.causal_conv1d_prefill(xs[0], w, s2, qsl, slot_sets[0], hinit, L)
    print(f"  check conv prefill rel err {rel(got, want):.2e}, state equal {torch.equal(s1, s2)}", flush=True)
    nbytes = T * C * 2 * 2
    arm_sets = [
        frozenset({"conv.chunk8"}),
        frozenset({"conv.chunk8", "conv.k4"}),
        frozenset({"conv.chunk8", "conv.vec4"}),
        frozenset({"conv.chunk8", "conv.k4", "conv.vec4"}),
        frozenset(),
    ]
    for order in (arm_sets, arm_sets[::-1]):  # ABBA: each arm timed twice, order reversed
        for arms in order:
            us = time_graph(
                lambda i, arms=arms: (
                    lambda: conv.causal_conv1d_prefill(
                        xs[i % 2], w, st, qsl, slot_sets[i % 2], hinit, L, arms=arms
                    )
                ),
                nbytes,
                max_r=2,
            )
            row("conv prefill", f"{nseq}x{L}", "cuda " + ("+".join(sorted(arms)) or "plain"), us, nbytes)
    us = time_eager(lambda: ref.causal_conv1d_prefill(xs[0], w, st, qsl, slot_sets[0], hinit, L))
    row("conv prefill", f"{nseq}x{L}", "torch reference (eager)", us, nbytes)
    for B in (1, 32):
        _bench_conv_decode(B, w)


def _bench_conv_decode(B: int, w) -> None:
    xd = bf16(64, B, C)
    std = bf16(64 * B + 1, C, 3)
    sl = [torch.arange(1 + i * B, 1 + (i + 1) * B, dtype=torch.int32, device=DEV) for i in range(64)]
    nb = B * C * (2 + 2 + 2 * 3 * 2)
    for arms in (frozenset({"conv.chunk8"}), frozenset({"conv.k4"})):
        us = time_graph(
            lambda i, arms=arms: lambda: conv.causal_conv1d_decode(xd[i], w, std, sl[i], arms=arms), nb
        )
        row("conv decode", f"B={B}", "cuda " + "+".join(sorted(arms)), us, nb)


def decode_inputs(B: int, r: int):
    q, k = bf16(r, B, NK, D), bf16(r, B, NK, D)
    v = bf16(r, B, NV, D)
    g = -torch.rand(r, B, NV, device=DEV)
    beta = torch.rand(r, B, NV, device=DEV)
    st = torch.randn(r * B + 1, NV, D, D, device=DEV) * 0.1
    slots = [torch.arange(1 + i * B, 1 + (i + 1) * B, dtype=torch.int32, device=DEV) for i in range(r)]
    return q, k, v, g, beta, st, slots


def bench_decode(fla) -> None:
    for B in (1, 8, 32, 64):
        _bench_decode_batch(fla, B)


def _bench_decode_batch(fla, B: int) -> None:
    state_bytes = B * NV * D * D * 4 * 2
    r = max(2, min(64, -(-4 * L2_BYTES // state_bytes)))
    q, k, v, g, beta, st, slots = decode_inputs(B, r)
    s1, s2 = st.clone(), st.clone()
    want = ref.recurrent_gated_delta_rule(q[0], k[0], v[0], g[0], beta[0], s1, slots[0])
    got = delta.recurrent_gated_delta_rule(q[0], k[0], v[0], g[0], beta[0], s2, slots[0])
    print(f"  check decode B={B} out rel {rel(got, want):.2e} state rel {rel(s2, s1):.2e}", flush=True)
    us = time_graph(
        lambda i: lambda: delta.recurrent_gated_delta_rule(q[i], k[i], v[i], g[i], beta[i], st, slots[i]),
        state_bytes,
    )
    row("gdn decode (recurrent)", f"B={B}", "cuda recurrent kernel", us, state_bytes)
    if fla is not None:
        qe = q.repeat_interleave(NV // NK, dim=2)
        ke = k.repeat_interleave(NV // NK, dim=2)
        init = [st[slots[i].long()].contiguous() for i in range(r)]
        us = time_graph(lambda i: fla_recurrent(fla, qe[i], ke[i], v[i], g[i], beta[i], init[i]), state_bytes)
        row("gdn decode (recurrent)", f"B={B}", "fla fused_recurrent (Triton)", us, state_bytes)
    us = time_graph(
        lambda i: lambda: ref.recurrent_gated_delta_rule(q[i], k[i], v[i], g[i], beta[i], st, slots[i]),
        state_bytes,
        max_r=8,
    )
    row("gdn decode (recurrent)", f"B={B}", "torch reference", us, state_bytes)
    # the whole GDN decode path of one layer minus projections: conv, gates, delta, norm
    w = bf16(C, 4, scale=0.5)
    cst = bf16(r * B + 1, C, 3)
    xs = bf16(r, B, C)
    ab = bf16(r, B, 2 * NV)
    A_log, dt_bias = torch.rand(NV, device=DEV), bf16(NV)
    z = bf16(r, B * NV, D)
    nw = torch.rand(D, device=DEV) + 0.5
    best = frozenset({"conv.k4"})

    def layer(i, arms=best):
        def call():
            y = conv.causal_conv1d_decode(xs[i], w, cst, slots[i], arms=arms)
            qq, kk = y[:, :2048].view(B, NK, D), y[:, 2048:4096].view(B, NK, D)
            vv = y[:, 4096:].view(B, NV, D)
            gg, bb = gating.gdn_gating(ab[i][:, :NV], ab[i][:, NV:], A_log, dt_bias)
            o = delta.recurrent_gated_delta_rule(qq, kk, vv, gg, bb, st, slots[i])
            return norm.gated_rms_norm(o.view(-1, D), z[i], nw, 1e-6)

        return call

    us = time_graph(layer, state_bytes)
    row("gdn decode layer (4 kernels)", f"B={B}", "cuda conv+gate+delta+norm", us, state_bytes)


def bench_prefill(fla) -> None:
    nseq, L = 32, 1024
    T = nseq * L
    qsl, hinit = prefill_batch(nseq, L)
    q, k, v = bf16(T, NK, D), bf16(T, NK, D), bf16(T, NV, D)
    g = -torch.rand(T, NV, device=DEV) * 0.3
    beta = torch.rand(T, NV, device=DEV)
    st = torch.randn(nseq + 1, NV, D, D, device=DEV) * 0.1
    slots = torch.arange(1, nseq + 1, dtype=torch.int32, device=DEV)
    s1, s2 = st.clone(), st.clone()
    want = ref.chunk_gated_delta_rule(q, k, v, g, beta, s1, qsl, slots, hinit, L)
    got = delta.chunk_gated_delta_rule(q, k, v, g, beta, s2, qsl, slots, hinit, L)
    print(f"  check prefill out rel {rel(got, want):.2e} state rel {rel(s2, s1):.2e}", flush=True)
    nbytes = T * (2 * NK * D * 2 + 2 * NV * D * 2) + nseq * NV * D * D * 4 * 2
    flops = 6 * T * NV * D * D  # the recurrence's multiply-adds, 2 FLOP each
    us = time_graph(
        lambda i: lambda: delta.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, L),
        nbytes,
        max_r=2,
    )
    row("gdn prefill (chunk op)", f"{nseq}x{L}", "cuda recurrent-form fp32", us, nbytes, flops)
    if fla is not None:
        run_fla = fla_chunk(fla, q, k, v, g, beta, st[slots.long()].contiguous(), qsl)
        fo, _ = run_fla()
        print(f"  check fla chunk vs reference out rel {rel(fo[0], want):.2e}", flush=True)
        us = time_graph(
            lambda i: run_fla,
            nbytes,
            max_r=2,
        )
        row(
            "gdn prefill (chunk op)", f"{nseq}x{L}", "fla chunk (Triton, q/k pre-expanded)", us, nbytes, flops
        )
    us = time_eager(lambda: ref.chunk_gated_delta_rule(q, k, v, g, beta, st, qsl, slots, hinit, L), reps=3)
    row("gdn prefill (chunk op)", f"{nseq}x{L}", "torch reference (eager)", us, nbytes, flops)
    # the prefill path of one layer minus projections: conv (with state), gates, delta, norm
    x = bf16(T, C)
    w = bf16(C, 4, scale=0.5)
    cst = bf16(nseq + 1, C, 3)
    ab = bf16(T, 2 * NV)
    A_log, dt_bias = torch.rand(NV, device=DEV), bf16(NV)
    z = bf16(T * NV, D)
    nw = torch.rand(D, device=DEV) + 0.5
    arms = frozenset({"conv.chunk8", "conv.k4"})

    def layer(i):
        def call():
            y = conv.causal_conv1d_prefill(x, w, cst, qsl, slots, hinit, L, arms=arms)
            qq, kk = y[:, :2048].view(T, NK, D), y[:, 2048:4096].view(T, NK, D)
            gg, bb = gating.gdn_gating(ab[:, :NV], ab[:, NV:], A_log, dt_bias)
            o = delta.chunk_gated_delta_rule(
                qq, kk, y[:, 4096:].view(T, NV, D), gg, bb, st, qsl, slots, hinit, L
            )
            return norm.gated_rms_norm(o.view(-1, D), z, nw, 1e-6)

        return call

    us = time_graph(layer, nbytes, max_r=2)
    row("gdn prefill layer (5 kernels)", f"{nseq}x{L}", "cuda conv+gate+delta+norm", us, nbytes, flops)
    xs, zs = bf16(T * NV, D), bf16(T * NV, D)
    nb = T * NV * D * 2 * 3
    us = time_graph(lambda i: lambda: norm.gated_rms_norm(xs, zs, nw, 1e-6), nb, max_r=2)
    row("gated rms norm", f"{T}x{NV}x{D}", "cuda", us, nb)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", choices=("conv", "decode", "prefill", "decode_fused", "prefill_tc"), action="append"
    )
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    fla = load_fla()
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    only = set(args.only or ("conv", "decode", "prefill", "decode_fused", "prefill_tc"))
    if "conv" in only:
        bench_conv(fla is not None)
    if "decode" in only:
        bench_decode(fla)
    if "prefill" in only:
        bench_prefill(fla)
    if "decode_fused" in only:  # K4 (engine/bench/decode.py)
        from engine.bench import decode as k4

        k4.bench(fla)
    if "prefill_tc" in only:  # tensor-core K2+K3 (engine/bench/chunk.py)
        from engine.bench import chunk as tc

        tc.bench(fla)
    rows = list(ROWS)
    imported = sys.modules.get("engine.bench.kernels")  # bench_decode/bench_chunk add rows there when
    if imported is not None and imported is not sys.modules[__name__]:  # this file runs as __main__
        rows += imported.ROWS
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
