"""Session 30: the conv prefill (default and arm conv.vec4), gated RMSNorm and fused GDN decode (K4, whose epilogue is the gated
norm) per call, one tree per process (run from each tree's root, in alternated order), at the 4B's
shapes. Before timing, each op's outputs (and updated pools) on fixed inputs are printed as a digest,
so two trees' lines show whether they compute the same bits. Timed as engine.bench.kernels.time_graph
(input sets rotated so calls read from HBM)."""

import hashlib

import numpy as np
import torch

from engine.bench.kernels import time_graph
from engine.ops.conv import cuda as conv
from engine.ops.gdn import decode as k4
from engine.ops.norm import cuda as norm

NK, NV, DV, C, KW = 16, 32, 128, 8192, 4
PROJ = C + NV * DV + 2 * NV  # the GDN layer's fused projection row: qkv | z | b | a
ARMS = frozenset({"conv.chunk8", "conv.k4"})


def bf16(rng, *shape, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale).to("cuda", torch.bfloat16)


def digest(*ts):
    h = hashlib.sha256()
    for t in ts:
        h.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def conv_inputs(rng, lens):
    t = sum(lens)
    proj = bf16(rng, t, PROJ, scale=2.0)
    state = bf16(rng, len(lens) + 1, C, KW - 1)
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    slots = torch.arange(1, len(lens) + 1, dtype=torch.int32, device="cuda")
    hinit = torch.tensor([i % 2 for i in range(len(lens))], dtype=torch.bool, device="cuda")
    return proj[:, :C], state, qsl, slots, hinit, max(lens)


def main():
    rng = np.random.default_rng(0)
    w = bf16(rng, C, KW, scale=0.5)
    nw = (torch.from_numpy(rng.random(DV, dtype=np.float32)) + 0.5).to("cuda", torch.bfloat16)
    for lens in ([1024, 1024], [1024], [992, 1024, 7, 1]):
        x, st, qsl, slots, hinit, mx = conv_inputs(rng, lens)
        st4 = st.clone()
        out = conv.causal_conv1d_prefill(x, w, st, qsl, slots, hinit, mx, arms=ARMS)
        print(f"digest conv {lens}: {digest(out, st)}", flush=True)
        out4 = conv.causal_conv1d_prefill(x, w, st4, qsl, slots, hinit, mx, arms=ARMS | {"conv.vec4"})
        print(f"digest conv vec4 {lens}: {digest(out4, st4)}", flush=True)
    for t in (2048, 1024, 32):
        proj = bf16(rng, t, PROJ)
        z = proj[:, C : C + NV * DV].view(t, NV, DV)
        x = bf16(rng, t, NV, DV, scale=2.0)
        print(f"digest gated T={t}: {digest(norm.gated_rms_norm(x, z, nw, 1e-6))}", flush=True)
    # K4 at batch 32 and 1: q|k|v and z rows of the fused projection, fp32 state pool
    A_log, dt = bf16(rng, NV, scale=0.5), bf16(rng, NV, scale=0.5)
    for b in (32, 1):
        proj = bf16(rng, b, PROJ, scale=2.0)
        cst = bf16(rng, b + 1, C, KW - 1)
        sst = torch.from_numpy(rng.standard_normal((b + 1, NV, DV, DV), dtype=np.float32) * 0.1).cuda()
        slots = torch.arange(1, b + 1, dtype=torch.int32, device="cuda")
        zz, bb, aa = proj[:, C : C + NV * DV], proj[:, C + NV * DV : C + NV * DV + NV], proj[:, -NV:]
        y = k4.gdn_decode(proj[:, :C], zz, bb, aa, w, cst, A_log, dt, nw, 1e-6, sst, slots, NK)
        print(f"digest k4 b{b}: {digest(y, cst, sst)}", flush=True)
    # times
    for lens in ([1024, 1024], [1024]):
        sets = [conv_inputs(rng, lens) for _ in range(6)]

        def c_call(i, sets=sets):
            x, st, qsl, slots, hinit, mx = sets[i % 6]
            return lambda: conv.causal_conv1d_prefill(x, w, st, qsl, slots, hinit, mx, arms=ARMS)

        def c4_call(i, sets=sets):
            x, st, qsl, slots, hinit, mx = sets[i % 6]
            arms = ARMS | {"conv.vec4"}
            return lambda: conv.causal_conv1d_prefill(x, w, st, qsl, slots, hinit, mx, arms=arms)

        for name, call in (("conv prefill", c_call), ("conv prefill vec4", c4_call)):
            us = time_graph(call, 2 * sum(lens) * C * 2)
            gb = 2 * sum(lens) * C * 2 / (us * 1e-6) / 1e12
            print(f"{name} {lens}: {us:7.1f} us ({gb:.2f} TB/s on x + out)", flush=True)
    for t in (2048, 1024):
        gsets = []
        for _ in range(6):
            proj = bf16(rng, t, PROJ)
            gsets.append((bf16(rng, t, NV, DV, scale=2.0), proj[:, C : C + NV * DV].view(t, NV, DV)))

        def g_call(i, sets=gsets):
            return lambda: norm.gated_rms_norm(*sets[i % 6], nw, 1e-6)

        us = time_graph(g_call, 3 * t * NV * DV * 2)
        print(f"gated_rms_norm T={t}: {us:7.1f} us", flush=True)


if __name__ == "__main__":
    main()
