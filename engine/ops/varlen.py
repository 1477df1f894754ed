"""Flat varlen batch <-> padded per-sequence layout, by index tensors only.

Every op that needs a per-sequence view packs the flat ``[T, ...]`` batch into ``[B, L, ...]`` with
zeros in the padding and unpacks the result back. All indices are derived on the device from
``query_start_loc``; the padded length ``L`` comes from the host (``max_query_len``), so nothing
here reads device memory from Python (no ``.item()``, no boolean-mask indexing, no ``nonzero``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VarlenIndex:
    """Gather/scatter indices between a flat varlen batch and its padded ``[B, L]`` layout."""

    lens: torch.Tensor  # [B] int64, new tokens per sequence
    gather: torch.Tensor  # [B, L] int64, flat token index of (b, j); clamped in the padding
    valid: torch.Tensor  # [B, L] bool, j < lens[b]
    token_seq: torch.Tensor  # [T] int64, sequence of each flat token
    token_pos: torch.Tensor  # [T] int64, position of each flat token inside its sequence

    @property
    def padded_len(self) -> int:
        return self.gather.shape[1]


def varlen_index(query_start_loc: torch.Tensor, num_tokens: int, padded_len: int) -> VarlenIndex:
    """Indices for packing ``num_tokens`` flat tokens into ``[B, padded_len]``.

    ``padded_len`` must be at least the longest sequence (the caller's ``max_query_len``, possibly
    rounded up, e.g. to a multiple of the chunk size).
    """
    qsl = query_start_loc.to(torch.int64)  # [B+1]
    dev = qsl.device
    starts = qsl[:-1]  # [B]
    lens = qsl[1:] - starts  # [B]
    pos = torch.arange(padded_len, device=dev)  # [L]
    valid = pos[None, :] < lens[:, None]  # [B, L]
    # padding slots point at a real token (clamped) so the gather never goes out of bounds;
    # pack() zeroes them afterwards
    gather = (starts[:, None] + pos[None, :]).clamp_(0, max(num_tokens - 1, 0))  # [B, L]
    tok = torch.arange(num_tokens, device=dev)  # [T]
    # right=True: a token at offset == qsl[b+1] belongs to sequence b+1
    token_seq = torch.searchsorted(qsl[1:].contiguous(), tok, right=True)  # [T]
    token_seq = token_seq.clamp_(max=max(lens.shape[0] - 1, 0))
    token_pos = tok - starts[token_seq]  # [T]
    return VarlenIndex(lens=lens, gather=gather, valid=valid, token_seq=token_seq, token_pos=token_pos)


def pack(x: torch.Tensor, ix: VarlenIndex) -> torch.Tensor:
    """``x [T, ...]`` -> ``[B, L, ...]`` with exact zeros in the padding."""
    out = x[ix.gather]  # [B, L, ...]
    mask = ix.valid.view(*ix.valid.shape, *([1] * (x.dim() - 1)))
    return torch.where(mask, out, torch.zeros((), dtype=x.dtype, device=x.device))


def unpack(y: torch.Tensor, ix: VarlenIndex) -> torch.Tensor:
    """``y [B, L, ...]`` -> ``[T, ...]``: the inverse of :func:`pack` on the valid entries."""
    return y[ix.token_seq, ix.token_pos]
