"""What the scheduler hands the model runner each step, and what comes back."""

from __future__ import annotations

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


@dataclass(frozen=True)
class SamplerOutput:
    """One entry per scheduled sequence with ``sample=True``, in batch order."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


class Runner(Protocol):
    """The scheduler's view of a model runner (the real ModelRunner, or a fake in tests)."""

    def execute_model(self, seqs: list[ScheduledSeq]) -> SamplerOutput: ...
