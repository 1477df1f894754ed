"""Session 30, device run 5: the conv prefill (8 channels and conv.vec4) and the gated RMSNorm at
2 x 1,024 tokens of the 4B, each launched twice, for Nsight Compute (ncu -k regex:...)."""

import numpy as np
import torch

from engine.ops.conv import cuda as conv
from engine.ops.norm import cuda as norm

C, NV, DV = 8192, 32, 128
PROJ = C + NV * DV + 2 * NV
rng = np.random.default_rng(0)


def bf16(*shape, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale).to("cuda", torch.bfloat16)


proj = bf16(2048, PROJ)
w, st = bf16(C, 4, scale=0.5), bf16(3, C, 3)
qsl = torch.tensor([0, 1024, 2048], dtype=torch.int32, device="cuda")
slots = torch.tensor([1, 2], dtype=torch.int32, device="cuda")
hinit = torch.tensor([True, False], device="cuda")
nw = bf16(DV)
x = bf16(2048, NV, DV)
z = proj[:, C : C + NV * DV].view(2048, NV, DV)
for arms in ({"conv.chunk8", "conv.k4"}, {"conv.chunk8", "conv.k4", "conv.vec4"}):
    for _ in range(2):
        conv.causal_conv1d_prefill(proj[:, :C], w, st, qsl, slots, hinit, 1024, arms=frozenset(arms))
for _ in range(2):
    norm.gated_rms_norm(x, z, nw, 1e-6)
torch.cuda.synchronize()
print("done")
