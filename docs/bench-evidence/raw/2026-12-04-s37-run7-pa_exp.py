"""Session 37 run 7: paged attention timings and output digests under this process's kernel sources
(DELTASERVE_CUDA_DIR: the session's start for A, the checkout for B)."""
import hashlib
import json
import os
import sys

import torch

from engine.bench import attention as A
from engine.bench import kernels as B
from engine.ops.attention.batches import make_batch

PREFILL = {
    "prefill 32 x 1024": [(0, 1024)] * 32,
    "prefill 2 x 1024": [(0, 1024)] * 2,
    "prefill 1 x 1024": [(0, 1024)],
    "prefill 4 x 512": [(0, 512)] * 4,
    "mixed 2x1024 + 32 dec": [(A.CTX, 1)] * 32 + [(0, 1024)] * 2,
    "chunk 512 after 3000": [(3000, 512)],
}


def digest(t):
    return hashlib.sha256(t.contiguous().view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]


def main():
    out = {"src": os.environ.get("DELTASERVE_CUDA_DIR", "checkout"), "us": {}, "digest": {}}
    for label, specs in PREFILL.items():
        batch = make_batch(specs, A.BS, A.HKV, A.H // A.HKV, A.D, seed=7)
        out["digest"][label] = digest(A.call(batch)())
        out["us"][label] = B.replay_us([A.call(batch)] * 4)
        del batch
    for bsz in (1, 8, 32, 64):
        specs = [(A.CTX, 1)] * bsz
        one = make_batch(specs, A.BS, A.HKV, A.H // A.HKV, A.D, seed=1)
        out["digest"][f"decode b{bsz}"] = digest(A.call(one)())
        batches = A.sets(specs, A.kv_bytes(one), seed=100)
        out["us"][f"decode b{bsz}"] = B.replay_us([A.call(b) for b in batches])
        del batches, one
    torch.cuda.empty_cache()
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps(out) + "\n")


main()
