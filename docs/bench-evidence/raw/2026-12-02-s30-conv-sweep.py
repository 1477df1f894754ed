"""Session 30, device run 6: the conv prefill kernel's template at other (tokens per thread, threads
per CTA, channels per thread) than the shipped ones, launched directly (NVRTC compiles any
instantiation), at 2 x 1,024 and 1 x 1,024 tokens of the 4B. Each must give the default's bits
(output and, via the shipped state update, nothing else changes); us per call as time_graph."""

import numpy as np
import torch

from engine.bench.kernels import time_graph
from engine.ops.compile import as_i32, as_u8, i32, kernel, launch, ptr
from engine.ops.conv import cuda as conv

C, PROJ = 8192, 12352
rng = np.random.default_rng(0)


def bf16(*shape, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale).to("cuda", torch.bfloat16)


def run(cfg, x, w, st, qsl, slots, hinit, mx):
    tok, threads, vec = cfg
    out = torch.empty((x.shape[0], C), dtype=x.dtype, device=x.device)
    fn = kernel(conv.SRC, f"conv_prefill_kernel<4, {tok}, {threads}, {vec}>")
    grid = (-(-C // (vec * threads)), -(-mx // tok), slots.shape[0])
    args = (ptr(x), i32(x.stride(0)), ptr(w), ptr(st), ptr(qsl), ptr(slots), ptr(hinit), ptr(out), i32(C), i32(4))
    launch(fn, grid, (threads,), args)
    return out


CFGS = [(8, 128, 4), (8, 128, 8), (16, 128, 4), (4, 128, 4), (8, 64, 4), (8, 256, 4), (16, 64, 4), (32, 128, 4), (16, 256, 4)]
w = bf16(C, 4, scale=0.5)
for lens in ([1024, 1024], [1024]):
    sets = []
    for _ in range(6):
        t = sum(lens)
        proj = bf16(t, PROJ, scale=2.0)
        st = bf16(len(lens) + 1, C, 3)
        qsl = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
        slots = torch.arange(1, len(lens) + 1, dtype=torch.int32, device="cuda")
        hinit = torch.tensor([i % 2 for i in range(len(lens))], dtype=torch.bool, device="cuda")
        sets.append((proj[:, :C], w, st, as_i32(qsl), as_i32(slots), as_u8(hinit), max(lens)))
    want = run(CFGS[0], *sets[0])
    for cfg in CFGS:
        same = torch.equal(run(cfg, *sets[0]).view(torch.int16), want.view(torch.int16))
        us = time_graph(lambda i, cfg=cfg: (lambda: run(cfg, *sets[i % 6])), 2 * sum(lens) * C * 2)
        print(f"{lens} tok {cfg[0]:2d} threads {cfg[1]:3d} vec {cfg[2]}: {us:6.1f} us  same bits {same}", flush=True)
