"""Partial neox RoPE, paged KV writes and paged causal attention (fp32 scores and softmax)."""

from __future__ import annotations

import functools

import torch

from engine.ops.varlen import pack, unpack, varlen_index

# Bound on the fp32 score tensor of one kv-head group in paged_attention (elements, 512 MiB): with
# the softmax output alongside, 32 x 1,024-token prefills at 16 heads stay near 1.5 GiB.
_SCORE_BUDGET = 1 << 27


@functools.lru_cache(maxsize=32)
def _inv_freq(rotary_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    # HF computes inv_freq once on the CPU at init and moves it; doing the same keeps the pow
    # bit-identical on every device, and the cache makes the host->device copy a one-off
    exps = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
    return (1.0 / (theta**exps)).to(device)  # [rot/2]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``rotary_dim`` dims of q ``[T, H, D]`` and k ``[T, Hkv, D]``; returns new tensors.

    cos/sin are computed in fp32 and cast to q.dtype before the rotation (a bf16 rotation in a bf16
    model, as in HF). Text-only mRoPE reduces to this 1-D RoPE.
    """
    inv_freq = _inv_freq(rotary_dim, float(theta), q.device)
    ang = positions.float()[:, None] * inv_freq[None, :]  # [T, rot/2]
    cos = torch.cat((ang.cos(), ang.cos()), dim=-1).to(q.dtype)[:, None, :]  # [T, 1, rot]
    sin = torch.cat((ang.sin(), ang.sin()), dim=-1).to(q.dtype)[:, None, :]  # [T, 1, rot]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)

    return rotate(q), rotate(k)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter k, v ``[T, Hkv, D]`` into ``[NB, bs, Hkv, D]`` caches at flat ``slot_mapping`` positions."""
    slots = slot_mapping.to(torch.int64)  # [T]
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v.to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    num_computed: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    *,
    gate: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the flat queries ``q [T, H, D]`` over each sequence's paged KV (written into
    ``out``, T x H x D values, when given).

    Query j of sequence b sits at ``num_computed[b] + j`` and sees key positions up to its own and
    below ``seq_lens[b]``. Scores, mask and softmax are fp32; the output is cast to q.dtype. With
    ``gate [T, H, D]`` the result is ``out * sigmoid(gate)`` in q.dtype (the gated-attention output
    gate, exactly as the model applied it after this op).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    dev = q.device
    ix = varlen_index(query_start_loc, num_tokens, max_query_len)
    num_seqs = ix.lens.shape[0]

    # flat cache slot of every key position 0 .. max_seq_len-1 of every sequence; positions past a
    # sequence's end read whatever block the table holds there (null block 0) and are masked below
    kpos = torch.arange(max_seq_len, device=dev)  # [Lk]
    blk_col = (kpos // block_size).clamp_(max=block_table.shape[1] - 1)
    blocks = block_table.to(torch.int64)[:, blk_col]  # [B, Lk]
    kv_slots = blocks * block_size + (kpos % block_size)[None, :]  # [B, Lk]
    k_all = k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[kv_slots]  # [B, Lk, Hkv, D]
    v_all = v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[kv_slots]  # [B, Lk, Hkv, D]

    qpos = num_computed.to(torch.int64)[:, None] + torch.arange(max_query_len, device=dev)  # [B, Lq]
    visible = (kpos[None, None, :] <= qpos[:, :, None]) & (
        kpos[None, None, :] < seq_lens.to(torch.int64)[:, None, None]
    )  # [B, Lq, Lk]; never empty because key 0 is always visible
    hidden = ~visible[:, None, None]  # [B, 1, 1, Lq, Lk]

    # [B, Lq, H, D] -> [B, Hkv, G*Lq, D]: the G query heads of one kv head share one matmul
    qp = pack(q, ix).view(num_seqs, max_query_len, num_kv_heads, group, head_dim)
    qp = qp.permute(0, 2, 3, 1, 4).float()  # [B, Hkv, G, Lq, D]

    per_kv_head = num_seqs * group * max_query_len * max_seq_len
    step = max(1, min(num_kv_heads, _SCORE_BUDGET // max(per_kv_head, 1)))
    outs = []
    for h0 in range(0, num_kv_heads, step):
        h1 = min(h0 + step, num_kv_heads)
        hk = h1 - h0
        kh = k_all[:, :, h0:h1].float().permute(0, 2, 3, 1)  # [B, hk, D, Lk]
        vh = v_all[:, :, h0:h1].float().transpose(1, 2)  # [B, hk, Lk, D]
        qh = qp[:, h0:h1].reshape(num_seqs, hk, group * max_query_len, head_dim)  # [B, hk, G*Lq, D]
        scores = (qh @ kh) * scale  # [B, hk, G*Lq, Lk]
        scores = scores.view(num_seqs, hk, group, max_query_len, max_seq_len)
        scores.masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(num_seqs, hk, group * max_query_len, max_seq_len)
        outs.append((probs @ vh).view(num_seqs, hk, group, max_query_len, head_dim))
    o = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]  # [B, Hkv, G, Lq, D]
    o = o.permute(0, 3, 1, 2, 4).reshape(num_seqs, max_query_len, num_heads, head_dim)
    o = unpack(o, ix).to(q.dtype)  # [T, H, D]
    o = o if gate is None else o * torch.sigmoid(gate)
    return o if out is None else out.copy_(o.view(out.shape))
