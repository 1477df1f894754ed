"""What AsyncLLM hands the server per request: RequestOutput deltas, built from EngineOutputs.

Per-request state lives in :class:`RequestState`: the incremental detokenizer and the stop-string
matcher, which holds back text that could still be the start of a stop string and cuts the output
before a matched stop string (excluded from the text, as OpenAI does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.messages import EngineOutput
from engine.sampling_params import FinishReason, SamplingParams, TokenLogprobs


@dataclass
class RequestOutput:
    """One delta of a request's output; the last one has ``finished`` set."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    logprobs: list[TokenLogprobs] | None
    finished: bool
    finish_reason: FinishReason | None
    """None while not finished."""
    stop_reason: str | int | None
    """The matched stop string, or the stop token id, or None."""
    num_prompt_tokens: int
    num_output_tokens: int
    """Tokens generated so far, this delta included."""
    arrival_time: float
    """time.monotonic() when generate() registered the request."""
    first_token_time: float | None
    """time.monotonic() when the first output token reached AsyncLLM."""
    prompt_logprobs: list[TokenLogprobs] | None = None
    """Prompt tokens 1.. scored (params.prompt_logprobs set); on the first delta only."""
    engine_timings: list[float] | None = None
    """On the delta with the first token: the engine's (queued, first scheduled, first token read
    back) times, time.monotonic() in its process (EngineOutput.timings)."""


class Detokenizer(Protocol):
    def add(self, ids: Sequence[int]) -> str: ...
    def flush(self) -> str: ...


class RequestState:
    """AsyncLLM's bookkeeping for one in-flight request (API process side)."""

    def __init__(
        self,
        request_id: str,
        prompt_len: int,
        params: SamplingParams,
        stop: Sequence[str],
        detok: Detokenizer,
        arrival_time: float,
    ) -> None:
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.params = params
        self.stop = tuple(s for s in stop if s)
        self.detok = detok
        self.arrival_time = arrival_time
        self.first_token_time: float | None = None
        self.num_output = 0
        self.finished = False
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._held = ""

    def process(self, out: EngineOutput, now: float) -> tuple[RequestOutput, bool]:
        """Turn one EngineOutput into a delta; the flag says a stop string ended a request the engine
        still runs (so the caller must abort it there)."""
        ids = list(out.new_token_ids)
        self.num_output += len(ids)
        if ids and self.first_token_time is None:
            self.first_token_time = now
        engine_done = out.finish_reason is not None
        # A stop token is reported (token id, stop_reason) but, like a stop string, not rendered.
        stopped = out.finish_reason is FinishReason.STOP
        text_ids = ids[:-1] if stopped and out.stop_token is not None else ids
        new = self.detok.add(text_ids) if text_ids else ""
        if engine_done:
            new += self.detok.flush()
        text, matched = self._apply_stop(new, final=engine_done)
        reason = out.finish_reason
        stop_reason: str | int | None = out.stop_token if stopped else None
        if matched is not None:
            reason, stop_reason = FinishReason.STOP, matched
        self.finished = reason is not None
        ro = RequestOutput(
            request_id=self.request_id,
            new_token_ids=ids,
            new_text=text,
            logprobs=list(out.logprobs) if out.logprobs is not None else None,
            finished=self.finished,
            finish_reason=reason,
            stop_reason=stop_reason,
            num_prompt_tokens=self.prompt_len,
            num_output_tokens=self.num_output,
            arrival_time=self.arrival_time,
            first_token_time=self.first_token_time,
            prompt_logprobs=list(out.prompt_logprobs) if out.prompt_logprobs is not None else None,
            engine_timings=list(out.timings) if out.timings is not None else None,
        )
        return ro, matched is not None and not engine_done

    def final(self, reason: FinishReason) -> RequestOutput:
        """A closing delta with no tokens (used for aborts initiated in the API process)."""
        self.finished = True
        return RequestOutput(
            self.request_id, [], "", None, True, reason, None, self.prompt_len, self.num_output,
            self.arrival_time, self.first_token_time,
        )  # fmt: skip

    def _apply_stop(self, new: str, final: bool) -> tuple[str, str | None]:
        if not self.stop:
            return new, None
        buf = self._held + new
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = buf.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            self._held = ""
            return buf[: best[0]], best[1]
        if final:
            self._held = ""
            return buf, None
        # Hold back the longest tail that is a proper prefix of some stop string.
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], None
