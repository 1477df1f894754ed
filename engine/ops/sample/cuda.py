"""Wrapper for cuda/sample/argmax.cu (arm ``sample.argmax``): greedy sampling's argmax in two launches.

torch's argmax over [S, V] gives each row one CTA, so a decode batch of 32 rows reads the 4B's
bf16 logits (248,320 entries a row, 15.9 MB) with 32 CTAs, at ~0.8 TB/s on the H200 (19.8 us a step,
docs/bench-evidence/2026-12-02-s29.md). Here each row is cut into ``splits`` chunks so the grid has
about two CTAs per multiprocessor, and a one-warp pass per row reduces the chunks' winners. The order
is torch's (engine/ops/sample/reference.py), so the token is the same bit for bit. Inputs the kernel
does not take (CPU, other dtypes, unaligned or strided rows) go to torch's argmax.
"""

from __future__ import annotations

import torch

from engine.ops.compile import i32, i64, kernel, launch, ptr, sm_count

SRC = "sample/argmax.cu"
THREADS = 256
UNROLL = 4  # vectors in flight per thread (the instantiation's third parameter)
PART_BYTES = 8  # ArgBest: float value, int index
_TYPES = {torch.bfloat16: ("bf16_t", 8), torch.float32: ("float", 4)}  # (kernel type, values per 16 B)
MAX_ROWS = 65535  # grid y


def plan(rows: int, vocab: int, vec: int, sms: int) -> tuple[int, int]:
    """(splits, chunk): about two CTAs per multiprocessor over all rows, each chunk a multiple of the
    vector width and at least one pass of the CTA (THREADS * vec entries), every split non-empty."""
    sweep = THREADS * vec
    splits = min(max(1, vocab // sweep), max(1, -(-2 * sms // rows)))
    chunk = -(-vocab // splits)
    chunk = -(-chunk // vec) * vec
    return -(-vocab // chunk), chunk


def takes(x: torch.Tensor) -> bool:
    """Whether the kernel runs this input (else torch's argmax does)."""
    kind = _TYPES.get(x.dtype)
    if kind is None or not x.is_cuda or x.dim() != 2:
        return False
    rows, vocab = x.shape
    vec = kind[1]
    return (
        0 < rows <= MAX_ROWS
        and 0 < vocab < 2**31 - 1
        and vocab % vec == 0
        and x.stride(1) == 1
        and x.stride(0) % vec == 0
        and x.data_ptr() % 16 == 0
    )


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [S, V] -> [S] int64, exactly ``x.argmax(dim=-1)``."""
    if not takes(x):
        return x.argmax(dim=-1)
    rows, vocab = x.shape
    name, vec = _TYPES[x.dtype]
    splits, chunk = plan(rows, vocab, vec, sm_count(x.device.index or 0))
    part = torch.empty(rows * splits * PART_BYTES, dtype=torch.uint8, device=x.device)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    fn = kernel(SRC, f"argmax_partial_kernel<{name}, {THREADS}, {UNROLL}>")
    launch(fn, (splits, rows), (THREADS,), (ptr(x), i64(x.stride(0)), i32(vocab), i32(chunk), ptr(part)))
    launch(kernel(SRC, "argmax_final_kernel"), (rows,), (32,), (ptr(part), i32(splits), ptr(out)))
    return out
