"""The request plumbing the completion and chat routes share: body -> SamplingParams, one wave per
HTTP request, and the per-choice accumulator behind both the JSON and the SSE response. The request
rules themselves belong to ``engine.frontend.input_processor`` (``st.llm.input_processor``)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.frontend.input_processor import PromptRequest
from engine.sampling_params import SamplingParams, TokenLogprobs
from server.access_log import record
from server.errors import APIError, from_exception
from server.generation_defaults import default
from server.metrics import RequestTimer
from server.protocol import INT64_MIN, ErrorResponse, _Request
from server.request_fields import refuse_unsupported
from server.state import ServerState
from server.streaming import (
    SSE_DONE,
    ClientDisconnected,
    Deadline,
    MergedOutputs,
    error_event,
    until_disconnect,
)

logger = logging.getLogger("deltaserve.server")
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 503)
}


# Checks ----------------------------------------------------------


@dataclass(frozen=True)
class RequestSampling:
    """The sampling fields of one request, resolved once: checkpoint defaults, token-level lists."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    logit_bias: tuple[tuple[int, float], ...]
    bad_words: tuple[tuple[int, ...], ...]


def check_common(body: _Request, st: ServerState) -> RequestSampling:
    """Checks that need the model before any prompt is read (the model name, refused fields, stop
    token ids, logit_bias ids, the max_tokens bound), and the request's resolved sampling fields."""
    st.check_model(body.model)
    refuse_unsupported(body)
    ip = st.llm.input_processor
    if body.stop_token_ids:
        ip.check_token_ids(body.stop_token_ids, "stop_token_ids")
    vocab = ip.vocab_size
    bias: list[tuple[int, float]] = []
    for key, value in (body.logit_bias or {}).items():
        if not (key.isascii() and key.isdigit() and len(key) < 20 and int(key) < vocab):
            raise APIError(400, f"logit_bias contains a token id outside [0, {vocab})", param="logit_bias")
        bias.append((int(key), float(value)))
    ip.check_max_tokens(body.max_tokens)
    d = st.defaults
    return RequestSampling(
        temperature=default(body, "temperature", d),
        top_p=default(body, "top_p", d),
        top_k=max(int(default(body, "top_k", d)), 0),
        min_p=default(body, "min_p", d),
        repetition_penalty=default(body, "repetition_penalty", d),
        logit_bias=tuple(bias),
        bad_words=bad_word_ids(st, body.bad_words or []),
    )


def bad_word_ids(st: ServerState, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Each word as tokens, alone and after a space (vLLM): mid-sentence words carry the space."""
    tok = st.llm.tokenizer
    out: list[tuple[int, ...]] = []
    for w in words:
        for variant in (w, " " + w.lstrip()) if not w.startswith(" ") else (w,):
            ids = tuple(tok.encode(variant))
            if ids and ids not in out:
                out.append(ids)
    return tuple(out)


def check_zero_max_tokens(max_tokens: int | None, scores_prompt: bool) -> None:
    if max_tokens == 0 and not scores_prompt:
        msg = "max_tokens must be at least 1 (0 only with echo or prompt_logprobs)"
        raise APIError(400, msg, param="max_tokens")


def sampling_params(
    body: _Request,
    rs: RequestSampling,
    max_tokens: int,
    logprobs: int | None,
    sample_index: int,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    seed = body.seed
    if seed is not None and sample_index:
        # n samples get seed, seed + 1, ...; wrap inside int64 instead of overflowing the wire format.
        seed = (seed + sample_index - INT64_MIN) % 2**64 + INT64_MIN
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=rs.temperature,
        top_p=rs.top_p,
        top_k=rs.top_k,
        min_p=rs.min_p,
        seed=seed,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=rs.repetition_penalty,
        logit_bias=rs.logit_bias,
        bad_words=rs.bad_words,
    )


def submit(
    st: ServerState,
    prompts: Sequence[list[int]],
    params: Sequence[Sequence[SamplingParams]],
    body: _Request,
    request_id: str,
) -> MergedOutputs:
    """Send every (prompt, sample) of one HTTP request to the engine as one wave; prompt-major order."""
    stop = tuple(body.stop_list())
    wave = [
        PromptRequest(f"{request_id}-{i}-{j}", ids, p, stop, body.skip_special_tokens)
        for i, ids in enumerate(prompts)
        for j, p in enumerate(params[i])
    ]
    return MergedOutputs(st.llm.generate_wave(wave))


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    index: int
    prompt_ids: list[int]
    timer: RequestTimer
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    seen_output: bool = False

    def add(self, out: Any, st: ServerState) -> None:
        self.timer.on_output(len(out.new_token_ids), out)
        st.metrics.sample(st.llm)
        self.seen_output = True
        self.text.append(out.new_text)
        self.token_ids.extend(out.new_token_ids)
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = list(out.prompt_logprobs)
        self.num_prompt_tokens = out.num_prompt_tokens or len(self.prompt_ids)
        self.num_output_tokens = out.num_output_tokens or len(self.token_ids)
        if out.finished:
            self.finish_reason = out.finish_reason
            self.stop_reason = out.stop_reason
            st.metrics.observe_finished(
                out.finish_reason,
                self.num_prompt_tokens,
                self.num_output_tokens,
                time.monotonic() - self.timer.start,
            )


def usage(choices: Sequence[ChoiceState], n: int) -> dict[str, int]:
    # Each prompt counts once however many samples it has (vLLM); every sample's output counts.
    prompt = sum(c.num_prompt_tokens or len(c.prompt_ids) for c in choices[::n])
    completion = sum(c.num_output_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def collect(merged: MergedOutputs, choices: list[ChoiceState], st: ServerState, deadline: Deadline):
    try:
        while (item := await merged.next(deadline.remaining())) is not None:
            choices[item[0]].add(item[1], st)
    finally:
        await merged.close_shielded()


async def respond(
    request: Request,
    st: ServerState,
    merged: MergedOutputs,
    choices: list[ChoiceState],
    stream: bool,
    build: Callable[[], dict[str, Any]],
    frames: Callable[[int, Any], list[bytes]],
    tail: Callable[[], list[bytes]],
    n: int = 1,
    request_id: str | None = None,
) -> Response:
    """Non-streaming: collect every choice, then ``build()`` the body. Streaming: wait for the first
    output (so that queue-full or a dead engine is still a proper status code), then SSE."""
    deadline = Deadline(st.config.request_timeout_s)
    if request_id is not None:
        record(request.scope, request_id=request_id)

    def log_usage() -> None:
        counts = usage(choices, n)
        record(
            request.scope,
            prompt_tokens=counts["prompt_tokens"],
            completion_tokens=counts["completion_tokens"],
        )

    try:
        if not stream:
            await until_disconnect(request, collect(merged, choices, st, deadline))
            log_usage()
            return JSONResponse(build())
        first = await until_disconnect(request, merged.next(deadline.remaining()))
    except ClientDisconnected:
        await merged.close_shielded()
        return Response(status_code=499)
    except BaseException:
        await merged.close_shielded()
        raise

    async def body() -> AsyncIterator[bytes]:
        failure: APIError | None = None
        try:
            item = first
            while item is not None:
                for frame in frames(*item):
                    yield frame
                item = await merged.next(deadline.remaining())
            for frame in tail():
                yield frame
        except Exception as exc:
            failure = from_exception(exc)
        finally:
            log_usage()
            await merged.close_shielded()
        if failure is not None:
            logger.warning("stream failed: %s", failure.message)
            yield error_event(failure.status, failure.message, failure.type, failure.code)
        yield SSE_DONE

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
