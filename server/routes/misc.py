"""Models, health, readiness, metrics, tokenize/detokenize and version."""

from __future__ import annotations

import platform
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.metrics import CONTENT_TYPE
from server.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from server.routes.chat import render_chat
from server.serving import ERROR_RESPONSES
from server.state import ServerState, get_state, package_version

router = APIRouter()
_STARTED = int(time.time())


def _card(st: ServerState) -> ModelCard:
    root = st.model_root or st.model_name
    return ModelCard(id=st.model_name, created=_STARTED, root=root, max_model_len=st.llm.max_model_len)


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> ModelList:
    return ModelList(data=[_card(get_state(request))])


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def get_model(model_id: str, request: Request) -> ModelCard:
    st = get_state(request)
    st.check_model(model_id)
    return _card(st)


@router.get("/health")
async def health(request: Request) -> Response:
    """Liveness: the process answers. 503 only once the engine is gone for good (a restart is the cure);
    a stalled but alive engine is readiness's business, not liveness's."""
    st = get_state(request)
    if st.engine_dead():
        return JSONResponse({"status": "engine_dead"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Readiness: 503 while draining, or when the engine is dead or stalled (AsyncLLM.is_ready)."""
    st = get_state(request)
    if st.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if st.engine_dead() or not st.llm.is_ready():
        return JSONResponse({"status": "engine_unavailable"}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    st = get_state(request)
    return Response(await st.metrics.render(st.llm), media_type=CONTENT_TYPE)


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": package_version(), "python": platform.python_version()}


@router.post("/tokenize", response_model=TokenizeResponse, responses=ERROR_RESPONSES)
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    st = get_state(request)
    st.check_model(body.model)
    if body.messages is not None:
        ids = await render_chat(
            st,
            body.messages,
            None,
            body.chat_template_kwargs,
            add_generation_prompt=body.add_generation_prompt,
        )
    else:
        ip = st.llm.input_processor
        ids = await ip.encode(body.prompt or "", add_special_tokens=body.add_special_tokens)
    return TokenizeResponse(count=len(ids), max_model_len=st.llm.max_model_len, tokens=ids)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    st = get_state(request)
    st.check_model(body.model)
    st.llm.input_processor.check_token_ids(body.tokens, "tokens")
    return DetokenizeResponse(prompt=st.llm.tokenizer.decode(body.tokens))
