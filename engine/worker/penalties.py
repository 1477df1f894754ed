"""Logit adjustments before sampling, in vLLM's order and with vLLM's definitions.

1. bad words: a word's last token is banned when the output ends with the word's other tokens;
2. min_tokens: stop tokens (EOS unless ignore_eos, and stop_token_ids) are banned until the request
   has generated ``min_tokens`` tokens;
3. logit_bias: added to the logits;
4. repetition penalty over prompt + output tokens (positive logits divided, others multiplied), then
   frequency (times each output count) and presence (once per output token seen) subtracted.

Everything over the vocabulary runs on device: histories become one padded ``[n, L]`` tensor whose
counts come from ``scatter_add``; the only Python loops are over rows and their short lists (bias
entries, bad words, stop ids).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampling_params import SamplingParams


def _padded(rows: Sequence[Sequence[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = [list(r) + [pad] * (width - len(r)) for r in rows]
    return torch.tensor(out, dtype=torch.int64, device=device).reshape(len(rows), width)


def token_counts(rows: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``[n, vocab]`` float counts of each token id per row (the padding id ``vocab`` is dropped)."""
    idx = _padded(rows, vocab, device)  # [n, L]
    counts = torch.zeros(len(rows), vocab + 1, device=device)
    counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=counts.dtype))
    return counts[:, :vocab]


def banned_by_bad_words(bad_words: Sequence[Sequence[int]], output: Sequence[int]) -> list[int]:
    banned = []
    for word in bad_words:
        prefix = list(word[:-1])
        if not prefix or list(output[len(output) - len(prefix) :]) == prefix:
            banned.append(word[-1])
    return banned


def _stop_ids(p: SamplingParams, eos_token_ids: Sequence[int]) -> list[int]:
    return list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))


def adjust_logits(
    logits: torch.Tensor,  # [S, V] fp32, or the raw bf16 / fp16 logits; not modified
    params: Sequence[SamplingParams],
    histories: Sequence[Sequence[int]],  # prompt + output so far, per row (may be empty when unused)
    num_prompt: Sequence[int],
    eos_token_ids: Sequence[int] = (),
) -> torch.Tensor:
    """The logits sampling draws from (fp32: raw bf16 logits are widened, exactly, with the copy this
    makes anyway); the input itself when no row adjusts anything."""
    rows = [i for i, p in enumerate(params) if p.adjusts_logits]
    if not rows:
        return logits
    vocab, dev = logits.shape[-1], logits.device
    sub = logits[rows].float()  # [n, V] copy
    sub_params = [params[i] for i in rows]
    # A caller without histories (none needed: logit_bias only) passes none; rows then have no tokens.
    histories = [histories[i] if i < len(histories) else () for i in range(len(params))]
    num_prompt = [num_prompt[i] if i < len(num_prompt) else 0 for i in range(len(params))]
    outputs = [histories[i][num_prompt[i] :] for i in rows]

    # Bans (bad words, stop tokens before min_tokens) as one scatter of -inf.
    bans: list[list[int]] = []
    for p, toks in zip(sub_params, outputs, strict=True):
        ban = banned_by_bad_words(p.bad_words, toks) if p.bad_words else []
        if len(toks) < p.min_tokens:
            ban += _stop_ids(p, eos_token_ids)
        bans.append(ban)
    if any(bans):
        mask = token_counts(bans, vocab, dev) > 0
        sub = sub.masked_fill(mask, float("-inf"))

    if any(p.logit_bias for p in sub_params):
        idx = _padded([[t for t, _ in p.logit_bias] for p in sub_params], vocab, dev)
        val = [[b for _, b in p.logit_bias] for p in sub_params]
        width = idx.shape[1]
        vals = torch.tensor([v + [0.0] * (width - len(v)) for v in val], device=dev).reshape(idx.shape)
        bias = torch.zeros(len(rows), vocab + 1, device=dev).scatter_add_(1, idx, vals)
        sub = sub + bias[:, :vocab]

    hist_rows = [j for j, p in enumerate(sub_params) if p.needs_history]
    if hist_rows:
        hp = [sub_params[j] for j in hist_rows]
        counts = token_counts([outputs[j] for j in hist_rows], vocab, dev)  # [h, V]
        x = sub[hist_rows]
        rep = torch.tensor([p.repetition_penalty for p in hp], device=dev)[:, None]
        if any(p.repetition_penalty != 1.0 for p in hp):
            prompts = [histories[rows[j]][: num_prompt[rows[j]]] for j in hist_rows]
            seen = (token_counts(prompts, vocab, dev) > 0) | (counts > 0)
            x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
        freq = torch.tensor([p.frequency_penalty for p in hp], device=dev)[:, None]
        pres = torch.tensor([p.presence_penalty for p in hp], device=dev)[:, None]
        x = x - freq * counts - pres * (counts > 0).to(x.dtype)
        sub[hist_rows] = x

    out = logits.to(torch.float32, copy=True)
    out[rows] = sub
    return out
