"""The start-up warm-up: batches of every kind a serving step can be, run once on the profile pool.

Kernels are built on first use (engine/ops/compile.py): a load from CuPy's disk cache takes
milliseconds, a first NVRTC compile about a second. Several launch choices depend on the batch, not
on the model: the GDN chunk kernel's dv block on how many prefill sequences share the step (and
whether the split path runs, on how long the longest is), the
skinny GEMM's row count on the decode batch, the attention kernel's warps on the longest query. A
server whose start-up ran only one full-budget prefill would compile the rest inside live steps,
stalling every running request for a second or more (two GDN chunk variants take 2-2.5 s each on the
H200's host; `docs/bench-evidence/2026-12-01-host-path.md`). These batches take
each of those choices once, so their kernels are built before the server says it is ready; the peak
over all of them is the step workspace the memory plan reserves.

The batches run on the throwaway profile pool, whose contents are never read back: sequences may
share a state slot (the pool has few), and decodes read whatever the pool holds.
"""

from __future__ import annotations

import math

from engine.model.forward_batch import SeqSpec

MAX_DECODES = 8  # the skinny GEMM's row counts stop at 8; larger decode batches run cuBLAS
MAX_PREFILL_SEQS = 64  # prefill sequences per warm-up step (the chunk kernel's CTA count grows with it)
# One 64-token chunk: below any split-path threshold (engine/ops/gdn/chunk_split.py needs a longest
# sequence of several chunks), so these prompts build the one-pass kernel's variants.
SHORT_PROMPT = 64


def probe_pool_size(tokens: int, max_num_seqs: int, block_size: int) -> tuple[int, int]:
    """(KV blocks, state slots) of the profile pool, each with its reserved index 0: room for the
    full-budget prefill plus one block per extra sequence, and up to MAX_DECODES distinct slots."""
    blocks = math.ceil(tokens / block_size) + min(max_num_seqs, MAX_PREFILL_SEQS) + 1
    return blocks, 1 + min(max_num_seqs, MAX_DECODES)


def warmup_batches(tokens: int, max_num_seqs: int, block_size: int, slots: int) -> list[list[SeqSpec]]:
    """The step shapes to run once at start-up, within ``tokens`` (--max-num-batched-tokens) and
    ``max_num_seqs``. ``slots`` is the pool's usable slot count (its slots 1..slots).

    - the full-budget prefill of one sequence (the profile step the memory plan has always run);
    - 2, 4, 8, ... and the most prefill sequences a step can hold, sharing the budget (the chunk
      kernel's dv block, and for few long sequences the split path's state pass);
    - the same counts of one-chunk prompts (the one-pass chunk kernel, which long prompts of few
      sequences no longer reach);
    - decode-only batches of 1..MAX_DECODES (the skinny GEMM's rows; eager steps, and what the
      decode graphs capture);
    - a mixed step: decodes first, then one prefill chunk filling the rest of the budget.
    """
    if tokens < 1 or max_num_seqs < 1 or slots < 1:
        raise ValueError(
            f"warm-up needs tokens, max_num_seqs and slots >= 1, got {tokens, max_num_seqs, slots}"
        )
    alloc = _Blocks(block_size)
    batches = [[alloc.prefill(tokens, 1)]]
    counts = prefill_counts(min(max_num_seqs, MAX_PREFILL_SEQS, tokens))
    for n in counts[1:]:
        alloc.reset()
        batches.append([alloc.prefill(tokens // n, 1 + i % slots) for i in range(n)])
    for n in counts:  # the same counts with one-chunk prompts: the one-pass chunk kernel, not the split
        if tokens // n > SHORT_PROMPT:
            alloc.reset()
            batches.append([alloc.prefill(SHORT_PROMPT, 1 + i % slots) for i in range(n)])
    for n in range(1, min(max_num_seqs, MAX_DECODES) + 1):
        alloc.reset()
        batches.append([alloc.decode(1 + i % slots) for i in range(n)])
    decodes = min(max_num_seqs - 1, MAX_DECODES, tokens - 1)
    if decodes >= 1:
        alloc.reset()
        mixed = [alloc.decode(1 + i % slots) for i in range(decodes)]
        batches.append([*mixed, alloc.prefill(tokens - decodes, 1 + decodes % slots)])
    return batches


def prefill_counts(cap: int) -> list[int]:
    """1, 2, 4, ... below ``cap``, then ``cap``. A launch choice that grows with the sequence count
    in steps at most doubling apart (the chunk kernel halves its dv block while the CTAs are too few)
    takes each of its values at some count here: [a, 2a) holds a power of two, and ``cap`` covers
    the top."""
    out, n = [], 1
    while n < cap:
        out.append(n)
        n *= 2
    return [*out, cap]


class _Blocks:
    """Hands out consecutive block ids from 1 for one warm-up batch."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.next = 1

    def reset(self) -> None:
        self.next = 1

    def _take(self, num_tokens: int) -> list[int]:
        n = math.ceil(num_tokens / self.block_size)
        ids = list(range(self.next, self.next + n))
        self.next += n
        return ids

    def prefill(self, length: int, slot: int) -> SeqSpec:
        return SeqSpec(token_ids=[0] * length, num_computed=0, block_ids=self._take(length), state_slot=slot)

    def decode(self, slot: int) -> SeqSpec:
        # one token already cached, one new: a decode as the scheduler builds it
        return SeqSpec(token_ids=[0], num_computed=1, block_ids=self._take(2), state_slot=slot)
