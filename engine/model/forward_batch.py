"""ForwardBatch: the one explicit object that describes a step's flat varlen token batch.

The model runner builds it on the host (no device sync) from the scheduled sequences; the
model and every op read their metadata from it. Sequences are ordered decodes first: the first
``num_decodes`` sequences each contribute exactly one new token and have prior state.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class SeqSpec:
    """One sequence's part of a step, as the runner sees it (host side)."""

    token_ids: Sequence[int]
    """The new tokens computed this step."""
    num_computed: int
    """Tokens of this sequence already in the KV cache / GDN state before this step."""
    block_ids: Sequence[int]
    """Block table: KV block ids covering at least ``num_computed + len(token_ids)`` tokens."""
    state_slot: int
    """GDN state slot (>= 1; 0 is the reserved padding slot)."""
    sample: bool = True
    """Whether the logits of the last new token are wanted."""

    @property
    def is_decode(self) -> bool:
        """One new token on top of existing state; a ForwardBatch puts these first."""
        return len(self.token_ids) == 1 and self.num_computed > 0


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, absolute position of each token in its sequence
    query_start_loc: torch.Tensor  # [B+1] int32, token offsets of each sequence in the flat batch
    seq_lens: torch.Tensor  # [B] int32, cached tokens after this step (num_computed + new)
    num_computed: torch.Tensor  # [B] int32, cached tokens before this step
    block_table: torch.Tensor  # [B, max_blocks] int32, 0 = null block
    slot_mapping: torch.Tensor  # [T] int64, flat KV position (block * block_size + offset) each token writes
    state_slot: torch.Tensor  # [B] int32, GDN state slot per sequence (0 = padding)
    has_initial_state: torch.Tensor  # [B] bool, sequence has conv/recurrent state from earlier steps
    logits_indices: torch.Tensor  # [S] int64, flat token indices whose logits are returned
    num_decodes: int  # the first num_decodes sequences are single-token decodes with state
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]
    num_computed_cpu: tuple[int, ...]
    block_size: int
    max_state_slot: int = 0
    """The highest state slot the batch uses (host side: an on-demand state pool maps it first)."""

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc_cpu[-1]

    @property
    def is_decode_only(self) -> bool:
        return self.num_decodes == self.num_seqs

    @staticmethod
    def build(
        seqs: Sequence[SeqSpec], block_size: int, device: torch.device | str, all_logits: bool = False
    ) -> ForwardBatch:
        """Build the flat batch on the host, then copy each tensor to ``device`` once.

        Decodes (one new token, ``num_computed > 0``) must come first; this is checked.
        ``all_logits`` returns logits for every token (tests compare whole prefills).
        """
        host, ints = host_arrays(seqs, block_size, all_logits)
        tensors: dict[str, Any] = dict(zip(host, to_device(list(host.values()), device), strict=True))
        return ForwardBatch(**tensors, **ints, block_size=block_size)


def host_arrays(
    seqs: Sequence[SeqSpec], block_size: int, all_logits: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A batch's per-token and per-sequence arrays on the host, named as ForwardBatch's tensors, and
    its host-side fields (``ForwardBatch.build`` copies the arrays to the device; the prefill graphs,
    engine/worker/prefill_graphs.py, copy them into a graph's static buffers)."""
    if not seqs:
        raise ValueError("ForwardBatch needs at least one sequence")
    # Checks and per-sequence values in one pass over the sequences; the per-token arrays (ids,
    # positions, KV slots) are built by numpy, since a 2,048-token step would cost the host a
    # Python iteration per token.
    lens: list[int] = []
    num_decodes = 0
    seen_prefill = False
    for s in seqs:
        n = len(s.token_ids)
        if n == 0:
            raise ValueError("a scheduled sequence has no new tokens")
        if s.state_slot < 1:
            raise ValueError(f"state slot {s.state_slot} is reserved")
        total = s.num_computed + n
        if len(s.block_ids) * block_size < total:
            raise ValueError(f"block table covers {len(s.block_ids) * block_size} tokens, need {total}")
        if s.is_decode and not seen_prefill:
            num_decodes += 1
        elif s.is_decode:
            raise ValueError("decodes must come before prefills in a ForwardBatch")
        else:
            seen_prefill = True
        lens.append(n)
    computed = [s.num_computed for s in seqs]
    seq_lens = [c + n for c, n in zip(computed, lens, strict=True)]
    qsl = [0, *itertools.accumulate(lens)]
    num_tokens = qsl[-1]
    max_blocks = max(len(s.block_ids) for s in seqs)
    table = np.zeros((len(seqs), max_blocks), dtype=np.int32)
    for i, s in enumerate(seqs):
        table[i, : len(s.block_ids)] = s.block_ids
    ids = np.fromiter(itertools.chain.from_iterable(s.token_ids for s in seqs), np.int64, num_tokens)
    row = np.repeat(np.arange(len(seqs)), lens)  # the sequence of each token
    pos = np.arange(num_tokens, dtype=np.int64) + np.repeat(
        np.asarray(computed, dtype=np.int64) - np.asarray(qsl[:-1], dtype=np.int64), lens
    )
    slots = table[row, pos // block_size].astype(np.int64) * block_size + pos % block_size
    if all_logits:
        logits_idx = np.arange(num_tokens, dtype=np.int64)
    else:
        logits_idx = np.asarray([end - 1 for end, s in zip(qsl[1:], seqs, strict=True) if s.sample], np.int64)
    host: dict[str, np.ndarray] = {
        "input_ids": ids,
        "positions": pos,
        "query_start_loc": np.asarray(qsl, np.int32),
        "seq_lens": np.asarray(seq_lens, np.int32),
        "num_computed": np.asarray(computed, np.int32),
        "block_table": table,
        "slot_mapping": slots,
        "state_slot": np.asarray([s.state_slot for s in seqs], np.int32),
        "has_initial_state": np.asarray([s.num_computed > 0 for s in seqs], np.bool_),
        "logits_indices": logits_idx,
    }
    ints = {
        "num_decodes": num_decodes,
        "max_query_len": max(lens),
        "max_seq_len": max(seq_lens),
        "query_start_loc_cpu": tuple(qsl),
        "seq_lens_cpu": tuple(seq_lens),
        "num_computed_cpu": tuple(computed),
        "max_state_slot": max(s.state_slot for s in seqs),
    }
    return host, ints


_TORCH = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.bool_): torch.bool}


def to_device(arrays: list[np.ndarray], device: torch.device | str) -> list[torch.Tensor]:
    """Each host array as a tensor of its own dtype and shape on ``device``. On CUDA they travel
    together: packed into one pinned buffer at 8-byte aligned offsets, copied in one non-blocking
    transfer, and handed out as views of the one device buffer. A step's ten small copies from
    pageable memory took the host ~0.55 ms before its first kernel (a 2,048-token prefill on the
    H200's host, docs/bench-evidence/2026-12-02-s23-steps.md); the pinned buffer comes
    from torch's caching host allocator, which keeps it until the copy has run."""
    if torch.device(device).type != "cuda":
        return [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]
    host, offsets = pack_pinned(arrays)
    return unpack(host.to(device, non_blocking=True), arrays, offsets)


def pack_pinned(arrays: list[np.ndarray]) -> tuple[torch.Tensor, list[int]]:
    """The arrays in one pinned uint8 host buffer, each at an 8-byte aligned offset -> (buffer,
    offsets). Arrays of the same shapes and dtypes always get the same offsets."""
    offsets, total = layout(arrays)
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    raw = host.numpy()
    for a, off in zip(arrays, offsets, strict=True):
        raw[off : off + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    return host, offsets


def layout(arrays: list[np.ndarray]) -> tuple[list[int], int]:
    """(offsets, total bytes) of :func:`pack_pinned`'s buffer: each array at an 8-byte aligned offset."""
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // 8) * 8
    return offsets, max(total, 8)


def unpack(buf: torch.Tensor, arrays: list[np.ndarray], offsets: list[int]) -> list[torch.Tensor]:
    """Views of a uint8 buffer laid out by :func:`pack_pinned`, with the arrays' dtypes and shapes."""
    return [
        buf[off : off + a.nbytes].view(_TORCH[a.dtype]).view(a.shape)
        for a, off in zip(arrays, offsets, strict=True)
    ]


def fill(buf: torch.Tensor, arrays: list[np.ndarray]) -> None:
    """Copy host arrays into a static buffer laid out for them (:func:`layout`): on CUDA one pinned,
    non-blocking copy, stream-ordered after the replays before it (the pinned buffer is torch's
    caching host allocator's, not reused until the copy has run)."""
    if buf.is_cuda:
        buf.copy_(pack_pinned(arrays)[0], non_blocking=True)
        return
    for t, a in zip(unpack(buf, arrays, layout(arrays)[0]), arrays, strict=True):
        t.copy_(torch.from_numpy(np.ascontiguousarray(a)))
