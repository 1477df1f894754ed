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
from server.metrics import RequestTimer
from server.protocol import ChatCompletionRequest, ChatMessage, TemplateScalar
from server.serving import (
    ERROR_RESPONSES,
    ChoiceState,
    check_common,
    respond,
    sampling_params,
    submit,
    usage,
)
from server.state import ServerState, get_state
from server.streaming import sse

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


@router.post("/v1/chat/completions", response_model=None, responses=ERROR_RESPONSES)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    st = get_state(request)
    check_common(body, st)
    ip = st.llm.input_processor
    limit = body.output_limit()
    ip.check_max_tokens(limit, "max_completion_tokens")
    prompt_ids = await render_chat(st, body.messages, body.tools, body.chat_template_kwargs)
    ip.check_prompt(prompt_ids, "messages")
    max_tokens = ip.resolve_max_tokens(limit, len(prompt_ids))
    k = (body.top_logprobs or 0) if body.logprobs else None
    params = [[sampling_params(body, max_tokens, k, j) for j in range(body.n)]]
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    logger.info("chat", extra={"request_id": request_id, "prompt_tokens": len(prompt_ids), "n": body.n})
    start = time.monotonic()
    choices = [
        ChoiceState(index=j, prompt_ids=prompt_ids, timer=RequestTimer(st.metrics, start))
        for j in range(body.n)
    ]
    merged = submit(st, [prompt_ids], params, body, request_id)
    tok = st.llm.tokenizer
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": st.model_name}

    def build() -> dict[str, Any]:
        out = []
        for c in choices:
            out.append(
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": "".join(c.text)},
                    "logprobs": chat_logprobs(tok, c.token_ids, c.logprobs, k) if k is not None else None,
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                }
            )
        return {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": st.model_name,
            "choices": out,
            "usage": usage(choices, body.n),
        }

    def frames(index: int, out: Any) -> list[bytes]:
        c = choices[index]
        result = []
        if not c.seen_output:
            # OpenAI's first delta of every choice carries the role and no text.
            role = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
            result.append(sse({**head, "choices": [{**role, "finish_reason": None}]}))
        c.add(out, st)
        lp_obj = None
        if k is not None and out.logprobs:
            lp_obj = chat_logprobs(tok, out.new_token_ids, out.logprobs, k)
        if out.new_text or out.finished or lp_obj or out.new_token_ids:
            delta = {"content": out.new_text} if out.new_text or out.new_token_ids else {}
            choice = {
                "index": index,
                "delta": delta,
                "logprobs": lp_obj,
                "finish_reason": out.finish_reason if out.finished else None,
            }
            if out.finished:
                choice["stop_reason"] = out.stop_reason
            result.append(sse({**head, "choices": [choice]}))
        return result

    def tail() -> list[bytes]:
        if not body.include_usage():
            return []
        return [sse({**head, "choices": [], "usage": usage(choices, body.n)})]

    return await respond(
        request, st, merged, choices, body.stream, build, frames, tail, n=body.n, request_id=request_id
    )
