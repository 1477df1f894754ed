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
    prev_row: int = -1
    """A decode scheduled ahead (async scheduling): its one input token is not known on the host yet;
    it is the token sampled in row ``prev_row`` of the step launched before this one, which the
    runner reads on the device. ``token_ids`` then holds a placeholder."""


@dataclass(frozen=True)
class SamplerOutput:
    """One entry per scheduled sequence with ``sample=True``, in batch order."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    prompt_logprobs: list[list[TokenLogprobs] | None] = field(default_factory=list)
    """Parallel to *all* scheduled sequences (not only sampled ones); empty when none asked."""


class PendingStep(Protocol):
    """A launched step; ``result()`` waits for its sampled tokens (once)."""

    def result(self) -> SamplerOutput: ...


@dataclass(frozen=True)
class DoneStep:
    """A step that ran to completion at launch (a runner without asynchronous launches)."""

    output: SamplerOutput

    def result(self) -> SamplerOutput:
        return self.output


class Runner(Protocol):
    """The scheduler's view of a model runner (the real ModelRunner, or a fake in tests).

    A runner that can run ahead also has ``launch(seqs, prev) -> PendingStep``: it queues the step
    and returns before the tokens are on the host; rows with ``prev_row >= 0`` take their input token
    from ``prev``'s sampled tokens."""

    def execute_model(self, seqs: list[ScheduledSeq]) -> SamplerOutput: ...
