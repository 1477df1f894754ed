"""POST /v1/chat/completions: messages rendered by the model's own chat template, then the same wave
machinery as completions."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from engine.sampling_params import TokenLogprobs
from server.access_log import arrival
from server.chat_output import ChatOutput
from server.errors import APIError
from server.logprobs_format import vllm_prompt_logprobs
from server.metrics import RequestTimer
from server.protocol import ChatCompletionRequest, ChatMessage, TemplateScalar
from server.reasoning import make_reasoning_parser
from server.serving import (
    ERROR_RESPONSES,
    ChoiceState,
    check_common,
    check_zero_max_tokens,
    respond,
    sampling_params,
    submit,
    usage,
)
from server.state import ServerState, get_state
from server.streaming import sse
from server.tool_parsers import ToolCallStream, make_tool_stream

logger = logging.getLogger("deltaserve.server")
router = APIRouter()


async def render_chat(
    st: ServerState,
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, TemplateScalar] | None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The protocol's messages through the model's chat template (the input processor's), as ids."""
    dicts = [m.as_template_dict() for m in messages]
    return await st.llm.input_processor.render_chat(dicts, tools, kwargs, add_generation_prompt)


def chat_logprobs(tok: Any, token_ids: Sequence[int], lps: Sequence[TokenLogprobs], k: int) -> dict[str, Any]:
    content = []
    for tid, lp in zip(token_ids, lps, strict=False):
        piece = tok.decode([tid], skip_special_tokens=False)
        top = []
        for alt_id, alt_lp in list(lp.top)[:k]:
            alt = tok.decode([alt_id], skip_special_tokens=False)
            top.append({"token": alt, "logprob": alt_lp, "bytes": list(alt.encode())})
        content.append(
            {"token": piece, "logprob": lp.logprob, "bytes": list(piece.encode()), "top_logprobs": top}
        )
    return {"content": content}


def tool_stream(st: ServerState, body: ChatCompletionRequest) -> ToolCallStream | None:
    """The tool-call parser for this request, or None when its output is plain content."""
    cfg = st.config
    choice = body.tool_choice
    enabled = cfg.enable_auto_tool_choice and bool(cfg.tool_call_parser)
    if choice == "auto" and not enabled:
        raise APIError(
            400,
            'tool_choice "auto" needs the server started with --enable-auto-tool-choice --tool-call-parser',
            param="tool_choice",
        )
    if not body.tools or choice == "none" or not enabled:
        return None
    max_calls = 1 if body.parallel_tool_calls is False else None
    return make_tool_stream(cfg.tool_call_parser, body.tools, max_calls)


@router.post("/v1/chat/completions", response_model=None, responses=ERROR_RESPONSES)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    st = get_state(request)
    rs = check_common(body, st)
    ip = st.llm.input_processor
    limit = body.output_limit()
    if limit is None:
        limit = st.defaults.get("max_tokens")
    ip.check_max_tokens(limit, "max_completion_tokens")
    check_zero_max_tokens(limit, body.prompt_logprobs is not None)
    tools = tool_stream(st, body)  # checks tool_choice before any work
    prompt_ids = await render_chat(
        st, body.messages, body.tools, body.chat_template_kwargs, body.add_generation_prompt
    )
    ip.check_prompt(prompt_ids, "messages")
    max_tokens = ip.resolve_max_tokens(limit, len(prompt_ids))
    k = (body.top_logprobs or 0) if body.logprobs else None
    pk = body.prompt_logprobs
    params = [[sampling_params(body, rs, max_tokens, k, j, pk) for j in range(body.n)]]
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    start = time.monotonic()
    arrived = arrival(request.scope) or start  # TTFT and E2E count from the request's arrival
    choices = [
        ChoiceState(index=j, prompt_ids=prompt_ids, timer=RequestTimer(st.metrics, arrived, start))
        for j in range(body.n)
    ]
    tok = st.llm.tokenizer
    reasoning = st.config.reasoning_parser
    # Whether the template left a <think> block open only shows at the prompt's end.
    prompt_tail = tok.decode(prompt_ids[-64:], skip_special_tokens=False) if reasoning else ""
    outputs = [
        ChatOutput(
            make_reasoning_parser(reasoning, prompt_tail) if reasoning else None,
            tools if j == 0 else tool_stream(st, body),
        )
        for j in range(body.n)
    ]
    merged = submit(st, [prompt_ids], params, body, request_id)
    # Logged once the request is on its way (see the completions route); nothing that can fail
    # comes after the submission.
    logger.info(
        "chat",
        extra={"request_id": request_id, "prompt_tokens": len(prompt_ids), "n": body.n, "user": body.user},
    )
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": st.model_name}

    def build() -> dict[str, Any]:
        out = []
        for c, co in zip(choices, outputs, strict=True):
            # The same parser calls over the same deltas as streaming, so both give the same message.
            for piece in c.text[:-1]:
                co.feed(piece)
            co.finish(c.text[-1] if c.text else "")
            out.append(
                {
                    "index": c.index,
                    "message": co.message(),
                    "logprobs": chat_logprobs(tok, c.token_ids, c.logprobs, k) if k is not None else None,
                    "finish_reason": co.finish_reason(c.finish_reason),
                    "stop_reason": c.stop_reason,
                }
            )
        body_out = {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": st.model_name,
            "choices": out,
            "usage": usage(choices, body.n),
        }
        if pk is not None:
            body_out["prompt_logprobs"] = vllm_prompt_logprobs(
                tok, prompt_ids, choices[0].prompt_logprobs, pk
            )
        return body_out

    def chunk(index: int, delta: dict[str, Any], lp: Any = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": None}
        return sse({**head, "choices": [choice]})

    def frames(index: int, out: Any) -> list[bytes]:
        c, co = choices[index], outputs[index]
        result = []
        is_first = not c.seen_output
        c.add(out, st)
        if is_first:
            # OpenAI's first delta of every choice carries the role and no text.
            role = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
            first: dict[str, Any] = {**head, "choices": [{**role, "finish_reason": None}]}
            if pk is not None:
                first["prompt_logprobs"] = vllm_prompt_logprobs(tok, prompt_ids, c.prompt_logprobs, pk)
            result.append(sse(first))
        delta = co.finish(out.new_text) if out.finished else co.feed(out.new_text)
        lp_obj = None
        if k is not None and out.logprobs:
            lp_obj = chat_logprobs(tok, out.new_token_ids, out.logprobs, k)
        calls = delta.pop("tool_calls", [])
        if delta or lp_obj or (out.new_token_ids and not calls):
            # A chunk per engine output that carries tokens, even while the parsers hold text back.
            result.append(chunk(index, delta or {"content": ""}, lp_obj))
        for call_delta in calls:
            result.append(chunk(index, {"tool_calls": [call_delta]}))
        if out.finished:
            reason = co.finish_reason(out.finish_reason)
            last = {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}
            last["stop_reason"] = out.stop_reason
            result.append(sse({**head, "choices": [last]}))
        return result

    def tail() -> list[bytes]:
        if not body.include_usage():
            return []
        return [sse({**head, "choices": [], "usage": usage(choices, body.n)})]

    return await respond(
        request, st, merged, choices, body.stream, build, frames, tail, n=body.n, request_id=request_id
    )
