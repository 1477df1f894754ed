"""Causal depthwise conv1d + SiLU over the GDN q|k|v channels, with a K-1 column state pool.

HF keeps K state columns, vLLM/fla keep K-1; the oldest of HF's columns never reaches an output,
so the results are identical. Numerics follow HF's ``causal_conv1d_fn`` / ``causal_conv1d_update``:
the window is cast to the weight dtype, ``F.conv1d`` computes it, SiLU runs in that dtype, and the
result is cast back to the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops.varlen import pack, unpack, varlen_index


def _depthwise_silu(window: torch.Tensor, weight: torch.Tensor, padding: int, keep: int) -> torch.Tensor:
    """Depthwise conv of ``window [B, C, W]`` in the weight dtype; SiLU on the last ``keep`` columns.

    ``padding`` is what HF passes at that call site (K-1 in prefill, 0 in decode) and the slice is
    taken before SiLU as HF does: torch picks different conv kernels with and without padding, and
    on CPU SiLU rounds differently on contiguous (vectorised) and strided (scalar) loops, so only
    the same layout is bit-identical.
    """
    channels, width = weight.shape
    out = F.conv1d(window.to(weight.dtype), weight.unsqueeze(1), padding=padding, groups=channels)
    # output column o ends at window column o - padding + K - 1, so the output for the last window
    # column is column W - K + padding
    end = window.shape[-1] - width + padding + 1
    return F.silu(out[:, :, end - keep : end])  # [B, C, keep]


def causal_conv1d_prefill(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_slot: torch.Tensor,
    has_initial_state: torch.Tensor,
    max_query_len: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen causal conv over a flat batch ``x [T, C]`` (into ``out``, T x C contiguous values, when
    given); updates ``conv_state [S, C, K-1]`` in place.

    Each sequence is prefixed by its K-1 previous inputs (from its state slot, or zeros without
    history), so one conv over ``[B, C, K-1+L]`` gives every output, and the new state is
    simply the K-1 window columns ending at the sequence's last token.
    """
    dst = out
    num_tokens, _ = x.shape
    hist_len = weight.shape[1] - 1
    ix = varlen_index(query_start_loc, num_tokens, max_query_len)
    slots = state_slot.to(torch.int64)  # [B]

    # raw inputs in the promoted dtype, as HF's torch.cat(state, new) would give
    raw_dtype = torch.promote_types(conv_state.dtype, x.dtype)
    xp = pack(x, ix).transpose(1, 2).to(raw_dtype)  # [B, C, L]
    hist = conv_state[slots].to(raw_dtype)  # [B, C, K-1]
    zero = torch.zeros((), dtype=raw_dtype, device=x.device)
    hist = torch.where(has_initial_state.view(-1, 1, 1), hist, zero)
    window = torch.cat([hist, xp], dim=-1)  # [B, C, K-1+L]

    out = _depthwise_silu(window, weight, padding=hist_len, keep=max_query_len).to(x.dtype)  # [B, C, L]

    # window column i holds relative input position i-(K-1); the last K-1 inputs of a sequence with
    # n new tokens are columns n .. n+K-2, which reach into the history when n < K-1
    cols = ix.lens[:, None] + torch.arange(hist_len, device=x.device)  # [B, K-1]
    new_state = window.gather(2, cols[:, None, :].expand(-1, window.shape[1], -1))  # [B, C, K-1]
    conv_state.index_copy_(0, slots, new_state.to(conv_state.dtype))

    y = unpack(out.transpose(1, 2), ix)  # [T, C]
    return y if dst is None else dst.view(y.shape).copy_(y)


def causal_conv1d_decode(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, state_slot: torch.Tensor
) -> torch.Tensor:
    """One new token per sequence, ``x [B, C]``; shifts it into ``conv_state[slot]`` in place."""
    slots = state_slot.to(torch.int64)  # [B]
    # HF concatenates the state with the new column before casting to the weight dtype
    state = conv_state[slots]  # [B, C, K-1]
    # HF's window has K+1 columns (its state keeps K); the extra oldest column never reaches the
    # output, but reproducing the [B, C, 2] conv output keeps SiLU on the same strided CPU loop
    # (vectorised and scalar loops round differently), so decode stays bit-identical to HF
    spare = torch.zeros_like(state[:, :, :1])
    window = torch.cat([spare, state, x.unsqueeze(-1)], dim=-1)  # [B, C, K+1], promoted dtype
    out = _depthwise_silu(window, weight, padding=0, keep=1).to(x.dtype)  # [B, C, 1]
    conv_state.index_copy_(0, slots, window[:, :, 2:].to(conv_state.dtype))
    return out[:, :, 0]
