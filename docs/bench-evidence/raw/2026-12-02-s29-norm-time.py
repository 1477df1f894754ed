"""Session 29: the gated RMSNorm (GDN output norm) and qk_norm_rope_kv kernels per call, one tree per
process (run from each tree's root, in alternated order), at the 4B's shapes: T = 2,048 / 1,024 / 32
tokens, 32 value heads of 128 (z a strided view of the fused projection, as the model passes it), 16
query and 4 kv heads of 256, rotary 64. Timed as engine.bench.kernels.time_graph: input sets rotated,
so each call reads from HBM at T = 2,048 and 1,024 (at T = 32 the 8 sets are reused: from L2).
Before timing, each op's output on fixed inputs is printed as a digest, so two trees' lines show
whether they compute the same bits."""

import hashlib

import numpy as np
import torch

from engine.bench.kernels import time_graph
from engine.ops.norm import cuda as norm
from engine.ops.norm import fused_cuda as fused

NV, DV, H, HKV, D, ROT, BS = 32, 128, 16, 4, 256, 64, 16


def bf16(rng, *shape, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale).to("cuda", torch.bfloat16)


def digest(*ts):
    h = hashlib.sha256()
    for t in ts:
        h.update(t.contiguous().view(torch.int16).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def gated_inputs(rng, t):
    proj = bf16(rng, t, 8 + NV * DV + 64)
    z = proj[:, 8 : 8 + NV * DV].view(t, NV, DV)
    x = bf16(rng, t, NV, DV, scale=2.0)
    return x, z


def qk_inputs(rng, t):
    proj = bf16(rng, t, 2 * H * D + 2 * HKV * D, scale=2.0)
    qg, k, v = torch.split(proj, [2 * H * D, HKV * D, HKV * D], dim=-1)
    nb = t // BS + 5
    kc = bf16(rng, nb, BS, HKV, D)
    vc = bf16(rng, nb, BS, HKV, D)
    slots = torch.from_numpy(rng.permutation(nb * BS)[:t].astype(np.int64)).cuda()
    pos = torch.from_numpy(rng.integers(0, 100_000, t)).cuda()
    return qg.view(t, H, 2 * D), k.view(t, HKV, D), v.view(t, HKV, D), kc, vc, slots, pos


def main():
    rng = np.random.default_rng(0)
    w = (torch.from_numpy(rng.random(DV, dtype=np.float32)) + 0.5).to("cuda", torch.bfloat16)
    qn, kn = bf16(rng, D, scale=0.3), bf16(rng, D, scale=0.3)
    for t in (2048, 1024, 32):
        x, z = gated_inputs(rng, t)
        g_out = norm.gated_rms_norm(x, z, w, 1e-6)
        qg, k, v, kc, vc, slots, pos = qk_inputs(rng, t)
        q = fused.qk_norm_rope_kv(qg, k, v, qn, kn, 1e-6, pos, ROT, 1e7, kc, vc, slots)
        print(f"digest T={t}: gated {digest(g_out)} qk {digest(q, kc, vc)}", flush=True)
        gsets = [gated_inputs(rng, t) for _ in range(8)]
        qsets = [qk_inputs(rng, t) for _ in range(8)]

        def g_call(i, sets=gsets):
            return lambda: norm.gated_rms_norm(*sets[i % 8], w, 1e-6)

        def qk_call(i, sets=qsets):
            qg, k, v, kc, vc, slots, pos = sets[i % 8]
            return lambda: fused.qk_norm_rope_kv(qg, k, v, qn, kn, 1e-6, pos, ROT, 1e7, kc, vc, slots)

        g_us = time_graph(g_call, 3 * t * NV * DV * 2)

        q_us = time_graph(qk_call, t * (H + 2 * HKV) * D * 2 * 2)
        print(f"T={t:<5} gated_rms_norm {g_us:7.1f} us   qk_norm_rope_kv {q_us:7.1f} us", flush=True)


if __name__ == "__main__":
    main()
