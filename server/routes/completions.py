"""POST /v1/completions: prompts (text, token ids, or lists of either) -> one wave -> text_completion."""

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
from server.generation_defaults import default
from server.logprobs_format import vllm_prompt_logprobs
from server.metrics import RequestTimer
from server.protocol import CompletionRequest
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
from server.state import get_state
from server.streaming import sse

logger = logging.getLogger("deltaserve.server")
router = APIRouter()


# Completions -----------------------------------------------------------------------------------


def _prompt_list(prompt: Any) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def completion_logprobs(
    tok: Any, token_ids: Sequence[int | None], lps: Sequence[TokenLogprobs | None], k: int, offset: int
) -> tuple[dict[str, Any], int]:
    """OpenAI's completions logprobs object; prompt tokens (echo) come with null logprobs."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tid, lp in zip(token_ids, lps, strict=True):
        piece = tok.decode([tid], skip_special_tokens=False) if tid is not None else ""
        out["tokens"].append(piece)
        out["text_offset"].append(offset)
        offset += len(piece)
        if lp is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(lp.logprob)
        top = {piece: lp.logprob}
        for alt_id, alt_lp in list(lp.top)[:k]:
            top.setdefault(tok.decode([alt_id], skip_special_tokens=False), alt_lp)
        out["top_logprobs"].append(top)
    return out, offset


@router.post("/v1/completions", response_model=None, responses=ERROR_RESPONSES)
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    st = get_state(request)
    rs = check_common(body, st)
    llm = st.llm
    ip = llm.input_processor
    requested = default(body, "max_tokens", st.defaults)
    check_zero_max_tokens(requested, body.echo or body.prompt_logprobs is not None)
    # Echo with logprobs scores the prompt (OpenAI); prompt_logprobs is vLLM's name for the same.
    score_k: int | None = body.prompt_logprobs
    if body.echo and body.logprobs is not None:
        score_k = max(body.logprobs, score_k or 0)
    if requested == 0 and score_k is None:
        score_k = 0  # echo of a prompt with nothing generated: the engine scores, the route drops it
    raw = _prompt_list(body.prompt)
    if not raw:
        ip.check_prompt([])
    prompts = await ip.batch_prompt_ids(raw)
    params = []
    for ids in prompts:
        max_tokens = ip.resolve_max_tokens(requested, len(ids))
        params.append(
            [sampling_params(body, rs, max_tokens, body.logprobs, j, score_k) for j in range(body.n)]
        )
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    start = time.monotonic()
    arrived = arrival(request.scope) or start  # TTFT and E2E count from the request's arrival
    choices = [
        ChoiceState(index=i * body.n + j, prompt_ids=ids, timer=RequestTimer(st.metrics, arrived, start))
        for i, ids in enumerate(prompts)
        for j in range(body.n)
    ]
    echo_text = [p if isinstance(p, str) else llm.tokenizer.decode(p) for p in raw] if body.echo else []
    offsets = [0] * len(choices)
    merged = submit(st, prompts, params, body, request_id)
    # Logged once the request is on its way: the JSON line is formatted and written synchronously
    # (25 us in a loop on the CPU dev machine), which a first token need not wait for.
    logger.info(
        "completion",
        extra={
            "request_id": request_id,
            "prompts": len(prompts),
            "n": body.n,
            "stream": body.stream,
            "user": body.user,
        },
    )
    tok = llm.tokenizer
    k = body.logprobs
    head = {"id": request_id, "object": "text_completion", "created": created, "model": st.model_name}

    def piece(
        c: ChoiceState, text: str, ids: list[int], lps: Sequence[TokenLogprobs | None] | None, first: bool
    ):
        """Text and logprobs of one stretch of output, with the echoed prompt in front of the first."""
        lp_obj = None
        if first and body.echo:
            prompt_idx = c.index // body.n
            text = echo_text[prompt_idx] + text
            if k is not None:
                ids = c.prompt_ids + ids
                scored = list(c.prompt_logprobs or [])[: len(c.prompt_ids) - 1]
                lps = [None] * (len(c.prompt_ids) - len(scored)) + scored + list(lps or [])
        if k is not None:
            lps = list(lps or [])
            lp_obj, offsets[c.index] = completion_logprobs(tok, ids[: len(lps)], lps, k, offsets[c.index])
        return text, lp_obj

    def build() -> dict[str, Any]:
        out = []
        for c in choices:
            text, lp_obj = piece(c, "".join(c.text), c.token_ids, c.logprobs, True)
            choice = {
                "index": c.index,
                "text": text,
                "logprobs": lp_obj,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            if body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = vllm_prompt_logprobs(
                    tok, c.prompt_ids, c.prompt_logprobs, body.prompt_logprobs
                )
            out.append(choice)
        return {**head, "choices": out, "usage": usage(choices, body.n)}

    def frames(index: int, out: Any) -> list[bytes]:
        c = choices[index]
        first = not c.seen_output
        c.add(out, st)
        text, lp_obj = piece(c, out.new_text, list(out.new_token_ids), out.logprobs, first)
        # One chunk per engine output that carries tokens, even when the text is still held back
        # (an incomplete UTF-8 sequence): clients then see every token's arrival, as from vLLM.
        if not (text or out.finished or out.new_token_ids or (lp_obj and lp_obj["tokens"])):
            return []
        choice = {
            "index": index,
            "text": text,
            "logprobs": lp_obj,
            "finish_reason": out.finish_reason if out.finished else None,
            "stop_reason": out.stop_reason if out.finished else None,
        }
        if first and body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(
                tok, c.prompt_ids, c.prompt_logprobs, body.prompt_logprobs
            )
        return [sse({**head, "choices": [choice]})]

    def tail() -> list[bytes]:
        if not body.include_usage():
            return []
        return [sse({**head, "choices": [], "usage": usage(choices, body.n)})]

    return await respond(
        request, st, merged, choices, body.stream, build, frames, tail, n=body.n, request_id=request_id
    )
