"""Session 27: one kernel family per run, launched a few times, for Nsight Compute (ncu -k / --nvtx).

    python3 raw/2026-12-02-s27-ncu-driver.py {prep|state|attn|k4|gemm}

Kernels are built with -lineinfo (CuPy's RawModule options patched here) so ncu's SourceCounters
section can name the source lines where the warps stall; CuPy's NVRTC temp directory is kept (its
TemporaryDirectory patched not to clean up) so that the source file the line table names still exists
when ncu reads the report (run with an empty CUPY_CACHE_DIR, else nothing is compiled). Shapes: Qwen3.5-4B, prefill 2 x 1,024 for
the GDN split passes and the attention, decode batch 32 for K4 and the projections (cuBLAS at M = 32,
the skinny kernel at M = 8 for comparison), each GEMM inside an NVTX range named after it.
"""

import sys
import tempfile

import cupy
import torch

_raw = cupy.RawModule


def _raw_lineinfo(*a, **kw):
    kw["options"] = tuple(kw.get("options", ())) + ("-lineinfo",)
    return _raw(*a, **kw)


cupy.RawModule = _raw_lineinfo


class _KeptDir:
    """tempfile.TemporaryDirectory that leaves the directory (and the .cu NVRTC compiled) in place."""

    def __init__(self, *a, **kw):
        self.name = tempfile.mkdtemp(prefix="ds-nvrtc-")

    def __enter__(self):
        return self.name

    def __exit__(self, *exc):
        return False


cupy.cuda.compiler.tempfile.TemporaryDirectory = _KeptDir

from engine.bench import chunk as BC  # noqa: E402
from engine.ops.gdn import chunk, chunk_split  # noqa: E402

what = sys.argv[1]
if what in ("prep", "state"):
    nseq, L = 2, 1024
    q, k, v, g, beta, st, qsl, slots, hinit = BC.inputs(nseq, L)
    T = nseq * L
    rows = chunk_split.entry_rows(T, nseq)
    entries = torch.empty(rows * BC.NV * chunk_split.ENTRY_BYTES, dtype=torch.uint8, device="cuda")
    out = torch.empty(T, BC.NV, BC.D, dtype=torch.bfloat16, device="cuda")
    qs, sl, hi = qsl.int(), slots.int(), hinit.to(torch.uint8)
    vv = chunk._vec16(v)
    for _ in range(3):
        chunk_split.launch_prep(q, k, g, beta, qs, nseq, entries, nk=BC.NK, nv=BC.NV)
        kw = {"nk": BC.NK, "nv": BC.NV, "st": "float", "dk2": False, "dvb": 64, "o1lo": True}
        chunk_split.launch_state(q, k, vv, entries, st, qs, sl, hi, out, **kw)
elif what == "attn":
    from engine.bench import attention as BA
    from engine.ops.attention.batches import make_batch

    batch = make_batch([(0, 1024)] * 2, BA.BS, BA.HKV, BA.H // BA.HKV, BA.D, seed=7)
    dec = make_batch([(BA.CTX, 1)] * 32, BA.BS, BA.HKV, BA.H // BA.HKV, BA.D, seed=1)
    for _ in range(3):
        BA.call(batch)()
        BA.call(dec)()
elif what == "k4":
    from engine.bench import decode as BD
    from engine.ops.gdn import decode

    sets, sl, w, cst, sst, A_log, dt_bias, nw = BD._inputs(32, 2)
    for i in range(3):
        qkv, z, b, a = sets[i % 2]
        decode.gdn_decode(qkv, z, b, a, w, cst, A_log, dt_bias, nw, BD.EPS, sst, sl[i % 2], BD.NK)
elif what == "gemm":
    from engine.ops.gemm import cuda as gemm

    shapes = {"in_proj": (12352, 2560), "out_proj": (2560, 4096), "gate_up": (18432, 2560),
              "down": (2560, 9216), "qkv": (10240, 2560), "lm_head": (248320, 2560)}
    ws = {n: torch.randn(nn, kk, device="cuda").to(torch.bfloat16) for n, (nn, kk) in shapes.items()}
    for m in (32, 8):
        for n, (nn, kk) in shapes.items():
            x = torch.randn(m, kk, device="cuda").to(torch.bfloat16)
            for _ in range(2):
                gemm.linear(x, ws[n])
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(f"m{m}_{n}")
            gemm.linear(x, ws[n])
            torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("driver done", what)
