"""Sampling on device: exact greedy, temperature / top-k / top-p / min-p, per-request seeds, logprobs.

Greedy is ``argmax`` over the logits, which returns the lowest index among ties, as HF does. The
graphs hand over their raw logits in the model dtype (bf16 on the GPU), whose fp32 widening (HF's
``.float()``) is exact: greedy rows take the argmax of the raw values (the same token), and every fp32
computation reads them widened on the fly (the temperature division and ``log_softmax(dtype=fp32)``
promote; the penalties widen the rows they adjust), so no [S, vocab] fp32 copy is made for them.
Random sampling uses the exponential-race trick (argmax of p / E with E ~ Exp(1)), which draws
exactly from p. A seeded request draws its noise from a generator seeded by (seed, output index),
so its tokens do not depend on which other requests share the batch, nor on preemption.
Penalties, logit_bias, bad words and min_tokens (engine/worker/penalties.py) shape the logits that are
sampled from; logprobs are those of the model's raw logits, as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.ops.sample.reference import argmax as reference_argmax
from engine.ops.sample.reference import logprobs as reference_logprobs
from engine.sampling_params import SamplingParams, TokenLogprobs
from engine.worker.penalties import adjust_logits

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: decorrelates consecutive (seed, step) pairs


def _row_seed(seed: int, step: int) -> int:
    return (seed * _MIX + step * 0xBF58476D1CE4E5B9 + 1) % (2**63 - 1)


@dataclass(frozen=True)
class SamplingBatch:
    """One step's sampling inputs, built once on the host by :meth:`Sampler.prepare` (before the
    forward runs) and read by :meth:`Sampler.sample`; a filter's tensor is None when no row uses it."""

    params: tuple[SamplingParams, ...]
    steps: tuple[int, ...]
    """Tokens each request generated before this one (seeds the per-request noise)."""
    random_rows: list[int]
    """Rows that sample; the others are greedy."""
    temperatures: torch.Tensor | None  # [R] for the random rows
    top_k: torch.Tensor | None  # [R]
    top_p: torch.Tensor | None  # [R]
    min_p: torch.Tensor | None  # [R]
    max_logprobs: int | None
    """The most alternatives any row asked for; None when no row wants logprobs."""
    histories: tuple[Sequence[int], ...] = ()
    """Prompt + output tokens per row, read only when some row adjusts its logits (penalties...)."""
    num_prompt: tuple[int, ...] = ()
    adjusts: bool = False


class Sampler:
    def __init__(
        self,
        device: torch.device | str,
        seed: int = 0,
        eos_token_ids: Sequence[int] = (),
        argmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
        logprobs: Callable[..., tuple] | None = None,
    ):
        """``argmax``: the greedy argmax (``Ops.argmax``: the model's table, a kernel on CUDA with the
        ``sample.argmax`` arm); ``logprobs``: ``Ops.logprobs`` (a kernel with ``sample.logprobs``);
        torch's by default."""
        self.device = torch.device(device)
        self.argmax = argmax if argmax is not None else reference_argmax
        self.logprobs = logprobs if logprobs is not None else reference_logprobs
        self.eos_token_ids = tuple(eos_token_ids)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def prepare(
        self,
        params: Sequence[SamplingParams],
        steps: Sequence[int],
        vocab: int,
        histories: Sequence[Sequence[int]] = (),
        num_prompt: Sequence[int] = (),
    ) -> SamplingBatch:
        rand = [i for i, p in enumerate(params) if not p.greedy]
        sub = [params[i] for i in rand]
        dev = self.device
        temps = top_k = top_p = min_p = None
        if sub:
            temps = torch.tensor([max(p.temperature, 1e-5) for p in sub], device=dev)
            if any(0 < p.top_k < vocab for p in sub):
                top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in sub], device=dev)
            if any(p.top_p < 1.0 for p in sub):
                top_p = torch.tensor([p.top_p for p in sub], device=dev)
            if any(p.min_p > 0 for p in sub):
                min_p = torch.tensor([p.min_p for p in sub], device=dev)
        wants = [p.logprobs for p in params if p.logprobs is not None]
        return SamplingBatch(
            tuple(params),
            tuple(steps),
            rand,
            temps,
            top_k,
            top_p,
            min_p,
            max(wants) if wants else None,
            tuple(histories),
            tuple(num_prompt),
            any(p.adjusts_logits for p in params),
        )

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
    def _filter(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
        """Temperature, then top-k, top-p and min-p masks over the random rows; returns probabilities.
        Raw bf16 logits are widened by the division (fp32 temperatures: type promotion), exactly."""
        assert b.temperatures is not None and b.temperatures.dtype == torch.float32
        logits = logits / b.temperatures[:, None]
        if b.top_k is not None:
            sorted_desc = logits.sort(dim=-1, descending=True).values
            kth = sorted_desc.gather(1, (b.top_k - 1)[:, None])
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = logits.softmax(dim=-1)
        if b.top_p is not None:
            sp, idx = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always survives).
            drop = (sp.cumsum(-1) - sp) >= b.top_p[:, None]
            sp = sp.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(1, idx, sp)
        if b.min_p is not None:
            thresh = probs.max(dim=-1, keepdim=True).values * b.min_p[:, None]
            probs = probs.masked_fill(probs < thresh, 0.0)
        return probs

    def sample(
        self,
        logits: torch.Tensor,  # [S, V] fp32, or the model's raw bf16 / fp16 logits
        b: SamplingBatch,
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        return self.sample_async(logits, b).host()

    def sample_async(self, logits: torch.Tensor, b: SamplingBatch) -> SampledTokens:
        """Sample on the device and start the copy to the host; nothing here waits for the device."""
        params, rand = b.params, b.random_rows
        raw = logits
        if b.adjusts:
            logits = adjust_logits(logits, params, b.histories, b.num_prompt, self.eos_token_ids)
        tokens = self.argmax(logits)
        if rand:
            probs = self._filter(logits[rand], b)
            noise = self._noise([params[i] for i in rand], [b.steps[i] for i in rand], logits.shape[-1])
            tokens[rand] = (probs / noise).argmax(dim=-1)
        if b.max_logprobs is None:
            return SampledTokens(tokens, params)
        # of the raw logits' fp32 widening; no rank (the API does not report one for sampled tokens)
        chosen, _, top_v, top_i = self.logprobs(raw, tokens, b.max_logprobs, rank=False)
        return SampledTokens(tokens, params, chosen, top_v, top_i)


class SampledTokens:
    """One step's sampled tokens on the device (``tokens``, read by a step launched after this one)
    and their copy to pinned host memory, in flight until :meth:`host` waits for it."""

    def __init__(
        self,
        tokens: torch.Tensor,
        params: Sequence[SamplingParams],
        chosen: torch.Tensor | None = None,
        top_v: torch.Tensor | None = None,
        top_i: torch.Tensor | None = None,
    ) -> None:
        self.tokens = tokens
        self.params = params
        cuda = tokens.device.type == "cuda"

        def to_host(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            h = torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
            return h.copy_(t, non_blocking=cuda)

        self._ids, self._chosen = to_host(tokens), to_host(chosen)
        self._top_v, self._top_i = to_host(top_v), to_host(top_i)
        self._event = torch.cuda.Event() if cuda else None
        if self._event is not None:
            self._event.record()

    def host(self) -> tuple[list[int], list[TokenLogprobs | None]]:
        if self._event is not None:
            self._event.synchronize()
        assert self._ids is not None
        ids: list[int] = self._ids.tolist()
        params = self.params
        if self._chosen is None:
            return ids, [None] * len(params)
        chosen: list[float] = self._chosen.tolist()
        top_v: list[list[float]] = self._top_v.tolist() if self._top_v is not None else [[] for _ in params]
        top_i: list[list[int]] = self._top_i.tolist() if self._top_i is not None else [[] for _ in params]
        out: list[TokenLogprobs | None] = []
        for r, p in enumerate(params):
            if p.logprobs is None:
                out.append(None)
                continue
            n = p.logprobs
            out.append(TokenLogprobs(ids[r], chosen[r], list(zip(top_i[r][:n], top_v[r][:n], strict=False))))
        return ids, out
