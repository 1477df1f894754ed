"""AsyncLLM: the API process's handle on the engine.

``generate()`` registers a request in the current wave; the wave goes to the engine as one
AddRequests message at the end of the event-loop turn (or after ``admission_window_ms``). One
output-handler task routes each step's outputs to per-request queues, detokenizing and applying stop
strings on the way. Leaving a stream early (aclose, cancellation, disconnect) aborts the request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import EngineConfig, ServerConfig
from engine.frontend.core_client import EngineCoreClient, InprocClient, MPClient
from engine.frontend.errors import (
    ContextLengthError,
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    RequestRejectedError,
)
from engine.frontend.input_processor import InputProcessor, PromptRequest
from engine.frontend.output_processor import Detokenizer, RequestOutput, RequestState
from engine.frontend.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.messages import AddRequests, EngineOutputs, EngineRequest, StepStats, UtilityRequest
from engine.sampling_params import FinishReason, SamplingParams
from engine.worker.step import Runner

__all__ = [
    "AsyncLLM",
    "ContextLengthError",
    "EngineDeadError",
    "EngineStats",
    "InvalidRequestError",
    "PromptRequest",
    "QueueFullError",
    "RequestOutput",
    "RequestRejectedError",
]

logger = logging.getLogger("deltaserve.async_llm")


@dataclass
class EngineStats:
    latest: StepStats | None = None
    total_steps: int = 0
    recent_admitted: deque[int] = field(default_factory=lambda: deque(maxlen=1024))
    """Requests admitted per step, for the steps that admitted any (wave sizes as the engine saw them)."""
    is_alive: bool = True
    last_step_time: float = 0.0
    """time.monotonic() when the latest step's outputs arrived."""
    num_unfinished: int = 0


class AsyncLLM:
    def __init__(
        self,
        client: EngineCoreClient,
        config: EngineConfig,
        server_config: ServerConfig,
        tokenizer: Any,
    ) -> None:
        self.client = client
        self.config = config
        self.server_config = server_config
        self.tokenizer = tokenizer
        info = client.ready_info
        self.model_name = config.model.served_model_name or Path(config.model.model).name or "deltaserve"
        self.max_model_len = info.max_model_len
        self.vocab_size = info.vocab_size or int(getattr(tokenizer, "vocab_size", 0))
        self.eos_token_ids = list(info.eos_token_ids)
        self.input_processor = InputProcessor(tokenizer, self.vocab_size, self.max_model_len)
        self._limit = config.scheduler.max_waiting_requests + config.scheduler.max_num_seqs
        self._requests: dict[str, RequestState] = {}
        self._wave: list[EngineRequest] = []
        self._flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self._dead: str | None = None
        self._closing = False
        self._stats = EngineStats()
        self._last_submit = 0.0
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._loop = asyncio.get_running_loop()
        self._output_task = self._loop.create_task(self._output_handler(), name="async-llm-output")

    @classmethod
    async def create(
        cls,
        config: EngineConfig,
        server_config: ServerConfig | None = None,
        in_process: bool = False,
        runner: Runner | None = None,
        tokenizer: Any = None,
        runner_factory: str | None = None,
    ) -> AsyncLLM:
        """Start the engine (a child process, or a thread when in_process or a runner object is given)."""
        loop = asyncio.get_running_loop()
        if tokenizer is None:
            tokenizer = await asyncio.to_thread(Tokenizer.from_dir, config.model.model)
        client: EngineCoreClient
        if in_process or runner is not None:
            client = await asyncio.to_thread(InprocClient, config, loop, runner)
        else:
            client = await asyncio.to_thread(MPClient, config, loop, runner_factory)
        return cls(client, config, server_config or ServerConfig(), tokenizer)

    # ---- submission ----------------------------------------------------------------------------
    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
    ) -> RequestStream:
        req = PromptRequest(request_id, list(prompt_token_ids), params, tuple(stop), skip_special_tokens)
        return self.generate_wave([req])[0]

    def generate_wave(self, requests: Sequence[PromptRequest]) -> list[RequestStream]:
        """Admit all requests together (one wave) or none: every check runs before anything is queued."""
        if self._dead is not None or self._closing:
            raise EngineDeadError(self._dead or "engine is shutting down")
        seen: set[str] = set()
        for req in requests:
            self.input_processor.validate(req)
            rid = req.request_id
            if rid in self._requests or rid in seen:
                raise InvalidRequestError("request_id", f"request id {rid!r} is already in use")
            seen.add(rid)
        if len(requests) > self._limit:
            # Admission is all-or-nothing, so this batch could not start even on an idle server: a 503
            # with Retry-After would send the client into a retry loop that never succeeds.
            raise InvalidRequestError(
                "n",
                f"this request needs {len(requests)} sequences (prompts x n) but the server admits at most "
                f"{self._limit} at once (max_num_seqs + max_waiting_requests); split it",
            )
        if self.client.input_full():
            raise QueueFullError("the engine is not keeping up with its input; retry later")
        if len(self._requests) + len(requests) > self._limit:
            raise QueueFullError(
                f"server busy: {len(self._requests)} requests in flight, limit {self._limit}; retry later"
            )
        now = time.monotonic()
        states = []
        for req in requests:
            ids, rid = req.prompt_token_ids, req.request_id
            detok = self._detokenizer(req.skip_special_tokens)
            st = RequestState(rid, len(ids), req.params, req.stop, detok, now)
            self._requests[rid] = st
            self._wave.append(EngineRequest(rid, list(ids), req.params, now))
            states.append(st)
        self._last_submit = now
        if self._flush_handle is None:
            window = self.server_config.admission_window_ms
            if window > 0:
                self._flush_handle = self._loop.call_later(window / 1000.0, self._flush_wave)
            else:
                self._flush_handle = self._loop.call_soon(self._flush_wave)
        return [RequestStream(self, st) for st in states]

    def _detokenizer(self, skip_special_tokens: bool) -> Detokenizer:
        return IncrementalDetokenizer(self.tokenizer, skip_special_tokens=skip_special_tokens)

    def _flush_wave(self) -> None:
        self._flush_handle = None
        wave, self._wave = self._wave, []
        if not wave:
            return
        try:
            self.client.add_requests(AddRequests(wave))
        except EngineDeadError as e:
            self._fail_all(e)
        except QueueFullError as e:  # the input backlog filled since admission: refuse this wave (503)
            for req in wave:
                st = self._requests.pop(req.request_id, None)
                if st is not None:
                    st.finished = True
                    st.queue.put_nowait(e)

    async def _stream(self, st: RequestState) -> AsyncGenerator[RequestOutput, None]:
        try:
            while True:
                item = await st.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            if not st.finished:
                self._abort(st, None)

    def abort(self, request_id: str) -> None:
        """Stop a request from the API side (e.g. timeout); its stream ends with finish_reason "abort"."""
        st = self._requests.get(request_id)
        if st is not None:
            self._abort(st, FinishReason.ABORT)

    def _abort(self, st: RequestState, reason: FinishReason | None) -> None:
        st.finished = True
        self._requests.pop(st.request_id, None)
        if reason is not None:
            st.queue.put_nowait(st.final(reason))
        queued = [r for r in self._wave if r.request_id != st.request_id]
        if len(queued) != len(self._wave):  # still in the unsent wave: just drop it
            self._wave = queued
        elif self._dead is None:
            try:
                self.client.abort([st.request_id])
            except EngineDeadError:
                pass

    # ---- outputs -------------------------------------------------------------------------------
    async def _output_handler(self) -> None:
        try:
            while True:
                msg = await self.client.get_output()
                if isinstance(msg, EngineOutputs):
                    self._handle_outputs(msg)
                else:
                    fut = self._calls.pop(msg.call_id, None)
                    if fut is not None and not fut.done():
                        if msg.error is not None:
                            fut.set_exception(RuntimeError(msg.error))
                        else:
                            fut.set_result(msg.result)
        except EngineDeadError as e:
            self._fail_all(e)
        except Exception as e:  # a bug here must not leave requests hanging
            logger.exception("output handler failed")
            self._fail_all(EngineDeadError(f"output handler failed: {e}"))

    def _handle_outputs(self, msg: EngineOutputs) -> None:
        now = time.monotonic()
        if msg.stats is not None:
            self._stats.latest = msg.stats
            self._stats.total_steps += 1
            self._stats.last_step_time = now
            if msg.stats.admitted:
                self._stats.recent_admitted.append(msg.stats.admitted)
        if msg.engine_error is not None:
            self._dead = msg.engine_error
        to_abort = []
        for out in msg.outputs:
            st = self._requests.get(out.request_id)
            if st is None:  # already finished here (stop string, abort); late tokens are dropped
                continue
            if out.error is not None:
                st.finished = True
                del self._requests[out.request_id]
                dead = msg.engine_error is not None
                st.queue.put_nowait(EngineDeadError(out.error) if dead else RequestRejectedError(out.error))
                continue
            ro, abort_in_engine = st.process(out, now)
            if ro.finished:
                del self._requests[out.request_id]
                if abort_in_engine:
                    to_abort.append(out.request_id)
            st.queue.put_nowait(ro)
        if to_abort and self._dead is None:
            try:
                self.client.abort(to_abort)
            except EngineDeadError:
                pass

    def _fail_all(self, exc: EngineDeadError) -> None:
        self._dead = self._dead or str(exc)
        for st in self._requests.values():
            st.finished = True
            st.queue.put_nowait(exc)
        self._requests.clear()
        self._wave = []
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(exc)
        self._calls.clear()

    # ---- health, stats, utility ----------------------------------------------------------------
    @property
    def is_alive(self) -> bool:
        return self._dead is None and not self._closing and self.client.is_alive

    @property
    def num_unfinished(self) -> int:
        return len(self._requests)

    @property
    def stats(self) -> EngineStats:
        self._stats.is_alive = self.is_alive
        self._stats.num_unfinished = len(self._requests)
        return self._stats

    def is_ready(self) -> bool:
        """Alive, and not stalled: with requests in flight, the engine finished a step recently."""
        if not self.is_alive or self.client.input_full():  # full: the engine reads nothing we send
            return False
        if not self._requests:
            return True
        last = max(self._stats.last_step_time, self._last_submit)
        return time.monotonic() - last < self.server_config.engine_stall_timeout_s

    async def call_utility(self, method: str, *args: Any, timeout_s: float = 30.0) -> Any:
        """One generic call into the engine: "stats", "check" (allocator invariants), "reset", "ping"."""
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._calls[call_id] = fut
        try:
            self.client.utility(UtilityRequest(call_id, method, list(args)))
            async with asyncio.timeout(timeout_s):  # never swallows a cancellation (3.11 wait_for can)
                return await fut
        finally:
            self._calls.pop(call_id, None)

    async def shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._output_task.cancel()
        try:
            await self._output_task
        except (asyncio.CancelledError, Exception):
            pass
        await asyncio.to_thread(self.client.shutdown)
        self._fail_all(EngineDeadError("engine shut down"))


class RequestStream:
    """One request's outputs as an async iterator. Closing it before the end (``aclose``, or dropping
    it unread) aborts the request in the engine; a plain async generator would not, since its
    ``finally`` never runs when it was never started."""

    def __init__(self, llm: AsyncLLM, st: RequestState) -> None:
        self._llm, self._st = llm, st
        self._gen = llm._stream(st)

    @property
    def request_id(self) -> str:
        return self._st.request_id

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        await self._gen.aclose()
        if not self._st.finished:
            self._llm._abort(self._st, None)

    def __del__(self) -> None:
        if not self._st.finished:
            try:
                self._llm._loop.call_soon_threadsafe(self._llm._abort, self._st, None)
            except RuntimeError:  # the loop is closed: nothing left to free
                pass
