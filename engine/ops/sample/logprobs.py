"""Wrapper for cuda/sample/logprobs.cu (arm ``sample.logprobs``): logprob, rank and top-k of raw logits.

The reference (engine/ops/sample/reference.py) widens the logits to fp32, writes their log-softmax
and reads it back for the gather, the rank count and the top-k: a scored 200-token prompt on the 4B
(248,320 entries a row) moves ~1 GB for 99 MB of bf16 logits. Here one read of the bf16 logits gives
each row's log-sum-exp, the target's logprob and rank and the top-1 entry (about two CTAs per
multiprocessor over all rows, then one warp per row merges the chunks); a top-k wider than 1 is
torch's topk over the raw logits (the same order as over their log-softmax), minus the log-sum-exp.
Inputs the kernel does not take (CPU, fp32, strided rows) go to the reference. Targets must lie in
[0, V) (the sampler's tokens do; the scorer checks the prompt's): no check here, as a check would wait
for the device in the middle of an asynchronous step.
"""

from __future__ import annotations

import torch

from engine.ops.compile import i32, i64, kernel, launch, ptr, sm_count
from engine.ops.sample import reference
from engine.ops.sample.cuda import THREADS, plan
from engine.ops.sample.cuda import takes as argmax_takes

SRC = "sample/logprobs.cu"
UNROLL = 4  # the instantiation's second parameter
PART_BYTES = 24  # LpPart: m, s, bv (fp32), bi, count, nan (int32)
VEC = 8  # bf16 entries per 16-byte load

Result = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


def takes(x: torch.Tensor, targets: torch.Tensor) -> bool:
    """Whether the kernel runs this input (else the reference does): bf16 rows the argmax kernel takes."""
    return (
        x.dtype == torch.bfloat16
        and argmax_takes(x)
        and targets.shape == (x.shape[0],)
        and targets.device == x.device
    )


def logprobs(x: torch.Tensor, targets: torch.Tensor, k: int, rank: bool = True) -> Result:
    """The reference's contract (``engine.ops.sample.reference.logprobs``) from one read of x."""
    if not takes(x, targets):
        return reference.logprobs(x, targets, k, rank)
    rows, vocab = x.shape
    tgt = targets.to(torch.int64).contiguous()  # in [0, V): the kernel clamps, never reads outside x
    splits, chunk = plan(rows, vocab, VEC, sm_count(x.device.index or 0))
    dev = x.device
    part = torch.empty(rows * splits * PART_BYTES, dtype=torch.uint8, device=dev)
    lse = torch.empty(rows, dtype=torch.float32, device=dev)
    chosen = torch.empty(rows, dtype=torch.float32, device=dev)
    ranks = torch.empty(rows, dtype=torch.int64, device=dev)
    top_v = torch.empty(rows, 1, dtype=torch.float32, device=dev)
    top_i = torch.empty(rows, 1, dtype=torch.int64, device=dev)
    fn = kernel(SRC, f"logprob_partial_kernel<{THREADS}, {UNROLL}>")
    stride = i64(x.stride(0))
    launch(fn, (splits, rows), (THREADS,), (ptr(x), stride, i32(vocab), i32(chunk), ptr(tgt), ptr(part)))
    outs = (ptr(lse), ptr(chosen), ptr(ranks), ptr(top_v), ptr(top_i))
    args = (ptr(part), i32(splits), ptr(x), stride, i32(vocab), ptr(tgt), *outs)
    launch(kernel(SRC, "logprob_final_kernel"), (rows,), (32,), args)
    if k == 0:
        return chosen, ranks if rank else None, None, None
    if k > 1:
        top = x.topk(min(k, vocab), dim=-1)
        top_v = top.values.float() - lse[:, None]
        top_i = top.indices
    return chosen, ranks if rank else None, top_v, top_i
