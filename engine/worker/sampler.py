"""Sampling on device: exact greedy, temperature / top-k / top-p / min-p, per-request seeds, logprobs.

Greedy is ``argmax`` over fp32 logits, which returns the lowest index among ties, as HF does.
Random sampling uses the exponential-race trick (argmax of p / E with E ~ Exp(1)), which draws
exactly from p. A seeded request draws its noise from a generator seeded by (seed, output index),
so its tokens do not depend on which other requests share the batch, nor on preemption.
Penalties, logit_bias, bad words and min_tokens (engine/worker/penalties.py) shape the logits that are
sampled from; logprobs are those of the model's raw logits, as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampling_params import SamplingParams, TokenLogprobs
from engine.worker.penalties import adjust_logits

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: decorrelates consecutive (seed, step) pairs


def _row_seed(seed: int, step: int) -> int:
    return (seed * _MIX + step * 0xBF58476D1CE4E5B9 + 1) % (2**63 - 1)


class Sampler:
    def __init__(self, device: torch.device | str, seed: int = 0, eos_token_ids: Sequence[int] = ()):
        self.device = torch.device(device)
        self.eos_token_ids = tuple(eos_token_ids)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def _noise(self, params: Sequence[SamplingParams], steps: Sequence[int], vocab: int) -> torch.Tensor:
        noise = torch.empty(len(params), vocab, device=self.device)
        noise.exponential_(generator=self.generator)
        for i, (p, step) in enumerate(zip(params, steps, strict=False)):
            if p.seed is not None:
                g = torch.Generator(device=self.device)
                g.manual_seed(_row_seed(p.seed, step))
                noise[i].exponential_(generator=g)
        return noise

    @staticmethod
    def _filter(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """Temperature, then top-k, top-p and min-p masks; returns probabilities."""
        temps = torch.tensor([max(p.temperature, 1e-5) for p in params], device=logits.device)
        logits = logits / temps[:, None]
        vocab = logits.shape[-1]
        if any(0 < p.top_k < vocab for p in params):
            ks = torch.tensor(
                [p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=logits.device
            )
            sorted_desc = logits.sort(dim=-1, descending=True).values
            kth = sorted_desc.gather(1, (ks - 1)[:, None])
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = logits.softmax(dim=-1)
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], device=logits.device)
            sp, idx = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
            drop = (sp.cumsum(-1) - sp) >= top_p[:, None]
            sp = sp.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(1, idx, sp)
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=logits.device)
            thresh = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
            probs = probs.masked_fill(probs < thresh, 0.0)
        return probs

    def sample(
        self,
        logits: torch.Tensor,  # [S, V] fp32
        params: Sequence[SamplingParams],
        steps: Sequence[int],  # tokens each request generated before this one
        histories: Sequence[Sequence[int]] = (),  # prompt + output per row; needed by penalties
        num_prompt: Sequence[int] = (),
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        greedy = [p.greedy for p in params]
        raw = logits
        if any(p.adjusts_logits for p in params):
            logits = adjust_logits(logits, params, histories, num_prompt, self.eos_token_ids)
        tokens = logits.argmax(dim=-1)
        if not all(greedy):
            rand = [i for i, g in enumerate(greedy) if not g]
            sub = [params[i] for i in rand]
            probs = self._filter(logits[rand], sub)
            noise = self._noise(sub, [steps[i] for i in rand], logits.shape[-1])
            tokens[rand] = (probs / noise).argmax(dim=-1)
        want = [p.logprobs is not None for p in params]
        if not any(want):
            return tokens.tolist(), [None] * len(params)
        logp = torch.log_softmax(raw, dim=-1)
        k = max(p.logprobs or 0 for p in params)
        chosen = logp.gather(1, tokens[:, None])[:, 0].tolist()
        top = logp.topk(k, dim=-1) if k else None
        top_v: list[list[float]] = top.values.tolist() if top is not None else [[] for _ in params]
        top_i: list[list[int]] = top.indices.tolist() if top is not None else [[] for _ in params]
        ids = tokens.tolist()
        out: list[TokenLogprobs | None] = []
        for r, p in enumerate(params):
            if p.logprobs is None:
                out.append(None)
                continue
            n = p.logprobs
            out.append(TokenLogprobs(ids[r], chosen[r], list(zip(top_i[r][:n], top_v[r][:n], strict=False))))
        return ids, out
