"""What the scheduler hands the model runner each step, and what comes back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.model.forward_batch import SeqSpec
from engine.sampling_params import SamplingParams, TokenLogprobs


@dataclass(frozen=True)
class ScheduledSeq(SeqSpec):
    """A SeqSpec plus what sampling needs. ``num_output`` counts tokens generated before this step."""

    request_id: str = ""
    params: SamplingParams = field(default_factory=SamplingParams)
    num_output: int = 0
    history: Sequence[int] = ()
    """The request's tokens so far (prompt + output; the engine's own list, not a copy). Read by
    penalties and prompt logprobs; may stay empty when ``params`` needs neither."""
    num_prompt: int = 0
    prompt_lp_from: int = 0
    """Prompt positions below this were scored already (before a preemption)."""


@dataclass(frozen=True)
class SamplerOutput:
    """One entry per scheduled sequence with ``sample=True``, in batch order."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    prompt_logprobs: list[list[TokenLogprobs] | None] = field(default_factory=list)
    """Parallel to *all* scheduled sequences (not only sampled ones); empty when none asked."""


class Runner(Protocol):
    """The scheduler's view of a model runner (the real ModelRunner, or a fake in tests)."""

    def execute_model(self, seqs: list[ScheduledSeq]) -> SamplerOutput: ...
