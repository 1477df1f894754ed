"""Per-request sampling parameters and finish reasons: typed values shared by the API process, the wire
and the runner."""

from __future__ import annotations

import enum

import msgspec


class FinishReason(enum.StrEnum):
    """Why a request ended, on the wire and in the OpenAI response (a str, so it serialises as itself)."""

    STOP = "stop"
    """A stop token or stop string."""
    LENGTH = "length"
    """max_tokens or the context length."""
    ABORT = "abort"
    """Aborted by the client (disconnect, timeout) or the API process."""
    ERROR = "error"
    """Rejected at admission or failed in the engine; the output's ``error`` says why."""


class SamplingParams(msgspec.Struct, frozen=True, omit_defaults=True, array_like=True, gc=False):
    """Validated by the server before it reaches the engine; the engine trusts these ranges."""

    max_tokens: int = 16
    """Most tokens to generate."""
    temperature: float = 1.0
    """0 means greedy (exact argmax, lowest index on ties)."""
    top_p: float = 1.0
    top_k: int = 0
    """0 (or -1) disables top-k."""
    min_p: float = 0.0
    seed: int | None = None
    """Seeded sampling is reproducible per request, independent of batch composition."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end the request (the model's EOS ids are added unless ignore_eos)."""
    ignore_eos: bool = False
    min_tokens: int = 0
    """Stop tokens are ignored until this many tokens were generated."""
    logprobs: int | None = None
    """None: no logprobs. k >= 0: the sampled token's logprob plus the top k alternatives."""
    prompt_logprobs: int | None = None
    """None: none. k >= 0: a logprob (plus top k) for every prompt token but the first. With this set,
    ``max_tokens`` may be 0: the prompt is scored and nothing is generated."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token the request has generated (vLLM, OpenAI)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the request generated it."""
    repetition_penalty: float = 1.0
    """vLLM's (CTRL's) penalty over prompt and output tokens: positive logits divided by it, others
    multiplied. 1.0 is off."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before sampling."""
    bad_words: tuple[tuple[int, ...], ...] = ()
    """Token sequences never generated: the last token of each is banned when the output ends with
    the rest of it."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_history(self) -> bool:
        """The sampler must see the request's tokens (penalties, bad words)."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
            or bool(self.bad_words)
        )

    @property
    def adjusts_logits(self) -> bool:
        """Anything but temperature/top-k/top-p/min-p changes the logits before sampling."""
        return self.needs_history or bool(self.logit_bias) or self.min_tokens > 0


class TokenLogprobs(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Logprob of one sampled token and its top alternatives (token id, logprob), best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = []
    rank: int | None = None
    """1-based rank of ``token_id`` in the distribution (set for prompt logprobs)."""
