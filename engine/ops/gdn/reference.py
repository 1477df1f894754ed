"""Gated DeltaNet gating and delta rules, mirroring HF's torch reference kernels op for op.

The chunk path is ``torch_chunk_gated_delta_rule`` run on a padded ``[B, Nv, L, d]`` batch: every
sequence starts its own 64-token chunks at its first new token, and the padding (q = k = v = 0,
beta = g = 0) neither decays nor updates the state, exactly like HF's own right padding. So each
sequence's output and final state equal what HF computes for it alone. The recurrent path is
``torch_recurrent_gated_delta_rule`` for a single step (note ``q / sqrt(dk)`` there vs
``q * dk**-0.5`` in the chunk path: each kept as HF has it).

The state pool may be fp32 or bf16 (``--mamba-ssm-cache-dtype``): both paths read ``state.float()``,
compute in fp32 and round to the pool's dtype once, when they store the state back (per decode step;
at the end of a prefill call, never between its chunks). With an fp32 pool neither conversion does
anything.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops.varlen import pack, unpack, varlen_index

CHUNK = 64


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``a, b [T, Nv]`` -> ``(g, beta)`` both ``[T, Nv]`` fp32.

    beta is the sigmoid in b's own dtype (bf16 in a bf16 model), only then widened, as in HF.
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())  # [T, Nv]
    beta = b.sigmoid().float()  # [T, Nv]
    return g, beta


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # fla/HF convention: eps is added to the sum of squares, not the mean
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def _expand_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """``[..., Nk, d]`` -> ``[..., Nv, d]``: value head j reads key head j // (Nv // Nk)."""
    rep = num_v_heads // x.shape[-2]
    return x if rep == 1 else x.repeat_interleave(rep, dim=-2)


def _initial_state(
    ssm_state: torch.Tensor, slots: torch.Tensor, has_initial_state: torch.Tensor
) -> torch.Tensor:
    state = ssm_state[slots].float()  # [B, Nv, dk, dv]
    return torch.where(
        has_initial_state.view(-1, 1, 1, 1), state, torch.zeros((), dtype=state.dtype, device=state.device)
    )


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    state_slot: torch.Tensor,
    has_initial_state: torch.Tensor,
    max_query_len: int,
    out: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """Chunked gated delta rule over a flat varlen batch (``workspace``, scratch memory the CUDA split
    path may use, is not needed here); ``ssm_state[slot]`` (fp32 or bf16) is
    updated in place, computed in fp32 and rounded to its dtype once at the end.

    q, k ``[T, Nk, dk]``, v ``[T, Nv, dv]``, g, beta ``[T, Nv]`` -> o ``[T, Nv, dv]`` in v.dtype, into
    ``out`` (as many contiguous values) when given.
    """
    num_tokens, num_v_heads, _ = v.shape
    dk = k.shape[-1]
    padded = -(-max_query_len // CHUNK) * CHUNK
    num_chunks = padded // CHUNK
    ix = varlen_index(query_start_loc, num_tokens, padded)
    slots = state_slot.to(torch.int64)  # [B]

    def to_bhld(x: torch.Tensor) -> torch.Tensor:
        # [T, H, d] -> [B, H, L, d] fp32, zero padded, contiguous like HF's transpose(1, 2).to(fp32)
        return pack(x, ix).transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)

    query = to_bhld(_expand_heads(q, num_v_heads))  # [B, Nv, L, dk]
    key = to_bhld(_expand_heads(k, num_v_heads))  # [B, Nv, L, dk]
    value = to_bhld(v)  # [B, Nv, L, dv]
    beta_p = pack(beta, ix).transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    decay = pack(g, ix).transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)  # [B, Nv, L]

    query = _l2norm(query)
    key = _l2norm(key)
    query = query * dk**-0.5

    v_beta = value * beta_p.unsqueeze(-1)
    k_beta = key * beta_p.unsqueeze(-1)

    def chunked(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], num_chunks, CHUNK, x.shape[-1])

    query, key, k_beta, v_beta = chunked(query), chunked(key), chunked(k_beta), chunked(v_beta)
    decay = decay.reshape(decay.shape[0], decay.shape[1], num_chunks, CHUNK)  # [B, Nv, n, C]

    upper = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=query.device).triu(1)  # what i may not see
    cum = decay.cumsum(dim=3)  # [B, Nv, n, C] log decay since the chunk start
    # pair[i, j] = exp(cum_i - cum_j) for j <= i; -inf above the diagonal before exp avoids overflow
    pair = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()  # [B, Nv, n, C, C]

    ut_system = (k_beta @ key.transpose(-1, -2)) * pair
    intra = (query @ key.transpose(-1, -2)) * pair
    decayed_k_beta = k_beta * cum.exp().unsqueeze(-1)
    # (I + strictly_lower(ut_system)) X = rhs; the diagonal and upper part are ignored by the solver
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, decayed_k_beta, upper=False, unitriangular=True)

    state = _initial_state(ssm_state, slots, has_initial_state)  # [B, Nv, dk, dv]
    acc = torch.zeros_like(new_values)  # [B, Nv, n, C, dv]

    query = query * cum.exp().unsqueeze(-1)
    key = key * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()[..., None, None]  # [B, Nv, n, 1, 1]

    for i in range(num_chunks):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state  # [B, Nv, C, dv]
        acc[:, :, i] = query[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + key[:, :, i].transpose(-1, -2) @ v_new

    ssm_state.index_copy_(0, slots, state.to(ssm_state.dtype))
    o = acc.reshape(acc.shape[0], num_v_heads, padded, -1).transpose(1, 2)  # [B, L, Nv, dv]
    o = unpack(o, ix).to(v.dtype)  # [T, Nv, dv]
    return o if out is None else out.view(o.shape).copy_(o)


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slot: torch.Tensor,
) -> torch.Tensor:
    """One decode step per sequence: q, k ``[B, Nk, dk]``, v ``[B, Nv, dv]``, g, beta ``[B, Nv]``.

    Decay, delta update, then read after the write; ``ssm_state[slot]`` (fp32 or bf16) is updated in
    place, rounded to its dtype after the step (the output is read from the fp32 state before that).
    """
    num_v_heads = v.shape[1]
    dk = k.shape[-1]
    slots = state_slot.to(torch.int64)  # [B]
    query = _l2norm(_expand_heads(q, num_v_heads).float())  # [B, Nv, dk]
    key = _l2norm(_expand_heads(k, num_v_heads).float())  # [B, Nv, dk]
    value = v.float()  # [B, Nv, dv]
    query = query / (dk**0.5)

    state = ssm_state[slots].float()  # [B, Nv, dk, dv]
    state = state * g.float().exp()[..., None, None]
    kv_mem = (state * key.unsqueeze(-1)).sum(dim=-2)  # [B, Nv, dv] what the state predicts for k
    delta = (value - kv_mem) * beta.float().unsqueeze(-1)
    state = state + key.unsqueeze(-1) * delta.unsqueeze(-2)
    out = (state * query.unsqueeze(-1)).sum(dim=-2)  # [B, Nv, dv]

    ssm_state.index_copy_(0, slots, state.to(ssm_state.dtype))
    return out.to(v.dtype)


def gdn_decode(
    qkv: torch.Tensor,
    z: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    ssm_state: torch.Tensor,
    state_slot: torch.Tensor,
    num_k_heads: int,
) -> torch.Tensor:
    """A GDN layer's whole decode step between its two projections, as the unfused ops run it.

    qkv ``[B, C]``, z ``[B, Nv*dv]``, b, a ``[B, Nv]`` -> y ``[B, Nv*dv]`` in qkv.dtype (the input
    of out_proj). The semantics a fused decode kernel (K4 in docs/kernels.md) must reproduce.
    """
    from engine.ops.conv.reference import causal_conv1d_decode
    from engine.ops.norm.reference import gated_rms_norm

    nb, nv = a.shape
    dv = norm_weight.shape[0]
    dk = (qkv.shape[1] - nv * dv) // (2 * num_k_heads)
    x = causal_conv1d_decode(qkv, conv_weight, conv_state, state_slot)
    q, k, v = torch.split(x, [num_k_heads * dk, num_k_heads * dk, nv * dv], dim=-1)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    o = recurrent_gated_delta_rule(
        q.reshape(nb, num_k_heads, dk),
        k.reshape(nb, num_k_heads, dk),
        v.reshape(nb, nv, dv),
        g,
        beta,
        ssm_state,
        state_slot,
    )
    return gated_rms_norm(o.reshape(-1, dv), z.reshape(-1, dv), norm_weight, eps).reshape(nb, nv * dv)
