"""The engine's view of one request: its tokens and how many of them are in the KV cache."""

from __future__ import annotations

import enum

from engine.sampling_params import FinishReason, SamplingParams, TokenLogprobs


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    """Queued; holds no blocks or slot (never scheduled, or preempted)."""
    RUNNING = "running"
    """Holds a slot and blocks; prefilling or decoding."""
    FINISHED = "finished"


class Request:
    """Mutable, engine-process only. ``token_ids`` is prompt + output so far, one list appended in place."""

    __slots__ = (
        "request_id",
        "params",
        "num_prompt_tokens",
        "token_ids",
        "num_computed",
        "status",
        "finish_reason",
        "stop_token",
        "num_preemptions",
        "ever_scheduled",
        "arrival_time",
        "prompt_logprobs",
        "queued_time",
        "scheduled_time",
    )

    def __init__(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float = 0.0
    ) -> None:
        self.request_id = request_id
        self.params = params
        self.num_prompt_tokens = len(prompt_token_ids)
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_computed = 0
        """Tokens whose KV / GDN state is computed; after a preemption this drops back to 0."""
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_token: int | None = None
        self.num_preemptions = 0
        self.ever_scheduled = False
        self.arrival_time = arrival_time
        self.queued_time = 0.0
        """time.monotonic() when the engine received it (its wave's received_time)."""
        self.scheduled_time = 0.0
        """time.monotonic() when it was first scheduled (kept across preemptions)."""
        self.prompt_logprobs: list[TokenLogprobs] = []
        """Scored prompt tokens (positions 1..), collected over prefill chunks; sent with the first output."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def max_num_tokens(self) -> int:
        """Tokens the request can ever hold: its KV footprint at the last step."""
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output}, computed={self.num_computed})"
        )
