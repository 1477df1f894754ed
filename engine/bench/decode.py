"""``python -m engine.bench.decode``: the K4 fused GDN decode (one launch per layer) against
today's four-launch CUDA path (conv decode + gating + recurrent delta rule + gated RMSNorm) and fla's
fused_recurrent_gated_delta_rule (the recurrence alone), at the W1 layer shape (Nk 16, Nv 32,
dk = dv = 128, 8192 conv channels) and batch 1, 8, 32, 64. First a correctness check against the
fp32 reference composition (and bitwise against the four CUDA ops), then the timings.

Timing is engine.bench.kernels.time_graph: R input sets and state slots per graph (>= 4x L2 of state),
median of replays / R. Bytes: the compulsory DRAM traffic of each implementation (fused and the
four-op path: fp32 state read + written, conv state read + written, qkv, z, y; fla: state, q/k/v, o).
"""

from __future__ import annotations

import sys

import torch

from engine.bench import kernels as B0
from engine.ops import reference as ref
from engine.ops.compile import kernel
from engine.ops.conv import cuda as conv
from engine.ops.gdn import decode, gating
from engine.ops.gdn import recurrent as delta
from engine.ops.norm import cuda as norm

NK, NV, D = 16, 32, 128
C = (2 * NK + NV) * D
VD = NV * D
EPS = 1e-6
DEV = "cuda"
FOUR_OP_ARMS = frozenset({"conv.k4"})


def _inputs(batch: int, r: int):
    """r input sets: fused projection rows (qkv | z | b | a), slots 1 + i*B .. for set i."""
    proj = B0.bf16(r, batch, C + VD + 2 * NV)
    sets = [(p[:, :C], p[:, C : C + VD], p[:, C + VD : C + VD + NV], p[:, C + VD + NV :]) for p in proj]
    slots = [
        torch.arange(1 + i * batch, 1 + (i + 1) * batch, dtype=torch.int32, device=DEV) for i in range(r)
    ]
    w = B0.bf16(C, 4, scale=0.5)
    cst = B0.bf16(r * batch + 1, C, 3)
    sst = torch.randn(r * batch + 1, NV, D, D, device=DEV) * 0.1
    A_log, dt_bias = B0.bf16(NV, scale=0.5), B0.bf16(NV)
    nw = (torch.rand(D, device=DEV) + 0.5).to(torch.bfloat16)
    return sets, slots, w, cst, sst, A_log, dt_bias, nw


def four_op(qkv, z, b, a, w, cst, A_log, dt_bias, nw, sst, slots, arms=FOUR_OP_ARMS):
    n = qkv.shape[0]
    x = conv.causal_conv1d_decode(qkv, w, cst, slots, arms=arms)
    q, k = x[:, : NK * D].view(n, NK, D), x[:, NK * D : 2 * NK * D].view(n, NK, D)
    g, beta = gating.gdn_gating(a, b, A_log, dt_bias)
    o = delta.recurrent_gated_delta_rule(q, k, x[:, 2 * NK * D :].view(n, NV, D), g, beta, sst, slots)
    return norm.gated_rms_norm(o.view(-1, D), z.reshape(-1, D), nw, EPS).view(n, VD)


def reference(qkv, z, b, a, w, cst, A_log, dt_bias, nw, sst, slots):
    n = qkv.shape[0]
    x = ref.causal_conv1d_decode(qkv, w, cst, slots)
    q, k = x[:, : NK * D].reshape(n, NK, D), x[:, NK * D : 2 * NK * D].reshape(n, NK, D)
    g, beta = ref.gdn_gating(a, b, A_log, dt_bias)
    o = ref.recurrent_gated_delta_rule(q, k, x[:, 2 * NK * D :].reshape(n, NV, D), g, beta, sst, slots)
    return ref.gated_rms_norm(o.reshape(-1, D), z.reshape(-1, D), nw, EPS).reshape(n, VD)


def check(batch: int = 32) -> bool:
    """Fused vs fp32 reference (y rel, conv state equal, ssm state rel) and vs the four CUDA ops (bits)."""
    sets, slots, w, cst, sst, A_log, dt_bias, nw = _inputs(batch, 1)
    qkv, z, b, a = sets[0]
    pools = [(cst.clone(), sst.clone()) for _ in range(3)]
    want = reference(qkv, z, b, a, w, pools[0][0], A_log, dt_bias, nw, pools[0][1], slots[0])
    comp = four_op(qkv, z, b, a, w, pools[1][0], A_log, dt_bias, nw, pools[1][1], slots[0])
    got = decode.gdn_decode(qkv, z, b, a, w, pools[2][0], A_log, dt_bias, nw, EPS, pools[2][1], slots[0], NK)
    live = slots[0].long()
    y_rel = B0.rel(got, want)
    s_rel = B0.rel(pools[2][1][live], pools[0][1][live])
    conv_eq = torch.equal(pools[2][0][live], pools[0][0][live])
    bits = (
        torch.equal(got.view(torch.int16), comp.view(torch.int16))
        and torch.equal(pools[2][0], pools[1][0])
        and torch.equal(pools[2][1].view(torch.int32), pools[1][1].view(torch.int32))
    )
    good = y_rel < 2e-3 and s_rel < 1e-3 and conv_eq
    print(
        f"  check B={batch}: y rel {y_rel:.2e}, ssm state rel {s_rel:.2e}, conv state equal {conv_eq}, "
        f"bitwise equal to the four CUDA ops {bits} -> {'ok' if good else 'FAIL'}",
        flush=True,
    )
    return good


def bench(fla) -> None:
    """Time the fused op, the four-op path (each twice, order reversed) and fla's recurrence."""
    for batch in (1, 8, 32, 64):
        _bench_batch(fla, batch)


def _bench_batch(fla, batch: int) -> None:
    state_bytes = batch * NV * D * D * 4 * 2
    layer_bytes = state_bytes + batch * (C * 3 * 2 * 2 + C * 2 + VD * 2 * 2)
    fla_bytes = state_bytes + batch * 4 * VD * 2  # q, k (expanded to Nv heads), v, o
    r = max(2, min(64, -(-4 * B0.L2_BYTES // state_bytes)))
    sets, slots, w, cst, sst, A_log, dt_bias, nw = _inputs(batch, r)
    shape = f"B={batch}"

    def fused(i):
        qkv, z, b, a = sets[i]
        return lambda: decode.gdn_decode(qkv, z, b, a, w, cst, A_log, dt_bias, nw, EPS, sst, slots[i], NK)

    def four(i):
        qkv, z, b, a = sets[i]
        return lambda: four_op(qkv, z, b, a, w, cst, A_log, dt_bias, nw, sst, slots[i])

    impls = [("cuda fused K4 (1 launch)", fused), ("cuda 4 ops conv.k4", four)]
    best: dict[str, float] = {}
    for order in (impls, impls[::-1]):  # each timed twice, order reversed
        for name, make in order:
            us = B0.time_graph(make, state_bytes)
            B0.row("gdn decode layer", shape, name, us, layer_bytes)
            best[name] = min(best.get(name, float("inf")), us)
    if fla is not None:
        qe = [s[0][:, : NK * D].view(batch, NK, D).repeat_interleave(NV // NK, dim=1) for s in sets]
        ke = [
            s[0][:, NK * D : 2 * NK * D].view(batch, NK, D).repeat_interleave(NV // NK, dim=1) for s in sets
        ]
        ve = [s[0][:, 2 * NK * D :].reshape(batch, NV, D) for s in sets]
        g = -torch.rand(r, batch, NV, device=DEV)
        beta = torch.rand(r, batch, NV, device=DEV)
        init = [sst[slots[i].long()].contiguous() for i in range(r)]
        us = B0.time_graph(
            lambda i: B0.fla_recurrent(fla, qe[i], ke[i], ve[i], g[i], beta[i], init[i]), state_bytes
        )
        B0.row("gdn decode recurrence only", shape, "fla fused_recurrent (Triton)", us, fla_bytes)
        best["fla"] = us
    fused_us, four_us = best[impls[0][0]], best[impls[1][0]]
    print(
        f"  B={batch}: fused {fused_us:.1f} us, 4 ops {four_us:.1f} us ({four_us / fused_us:.2f}x)"
        + (f", fla recurrence {best['fla']:.1f} us ({best['fla'] / fused_us:.2f}x)" if "fla" in best else "")
        + f"; state floor at copy BW {state_bytes / B0.COPY_BW * 1e6:.1f} us",
        flush=True,
    )


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    fla = B0.load_fla()
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    name = decode.kernel_name("float")
    fn = kernel(decode.SRC, name)
    print(f"  {name}: {fn.num_regs} regs, {fn.local_size_bytes} B local, {fn.shared_size_bytes} B smem")
    ok = check(32) & check(1)
    bench(fla)
    B0.print_table(B0.ROWS)
    return 0 if ok else 2


if __name__ == "__main__":
    raise SystemExit(main())
