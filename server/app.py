"""The FastAPI app factory: middlewares, error handlers and the routers of ``server.routes``. The app
does not own the engine: whoever built the AsyncLLM shuts it down
(``server.launch.serve`` in production, a fixture in tests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.config import ServerConfig
from server.errors import APIError, BodyLimitMiddleware, install_error_handlers, send_error
from server.metrics import Metrics
from server.state import EngineClient, ServerState, package_version

logger = logging.getLogger("deltaserve.server")


class DrainMiddleware:
    """Counts in-flight HTTP requests and, once draining (SIGTERM), answers new ones 503 at once.

    ``/health`` keeps answering so an orchestrator can tell "draining" from "dead".
    """

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        st = self.state
        if st.draining and scope.get("path") != "/health":
            err = APIError(503, "Server is shutting down", code="shutting_down", headers={"Retry-After": "5"})
            await send_error(send, err, close=True)
            return
        st.in_flight += 1
        st.idle.clear()
        try:
            await self.app(scope, receive, send)
        finally:
            st.in_flight -= 1
            if st.in_flight == 0:
                st.idle.set()


def build_app(llm: EngineClient, server_config: ServerConfig | None = None) -> FastAPI:
    """The whole HTTP surface over one AsyncLLM."""
    from server.access_log import AccessLogMiddleware
    from server.auth import APIKeyMiddleware
    from server.generation_defaults import load_defaults
    from server.http_limits import FramingMiddleware
    from server.reasoning import PARSERS as REASONING_PARSERS
    from server.routes.chat import router as chat_router
    from server.routes.completions import router as completions_router
    from server.routes.misc import router as misc_router
    from server.tool_parsers import PARSERS as TOOL_PARSERS

    config = server_config or ServerConfig()
    if config.reasoning_parser and config.reasoning_parser not in REASONING_PARSERS:
        raise ValueError(f"--reasoning-parser {config.reasoning_parser!r}: known are {REASONING_PARSERS}")
    if config.tool_call_parser and config.tool_call_parser not in TOOL_PARSERS:
        raise ValueError(f"--tool-call-parser {config.tool_call_parser!r}: known are {sorted(TOOL_PARSERS)}")
    if config.enable_auto_tool_choice and not config.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
    metrics = Metrics(llm.model_name, _device_name(llm))
    metrics.set_memory_split(_memory_split(llm))
    model_cfg = getattr(getattr(llm, "config", None), "model", None)
    model_dir = str(getattr(model_cfg, "model", "") or "")
    defaults = load_defaults(getattr(model_cfg, "generation_config", "auto"), model_dir) if model_dir else {}
    state = ServerState(
        llm=llm,
        config=config,
        metrics=metrics,
        model_name=llm.model_name,
        defaults=defaults,
        model_root=model_dir or None,
    )
    state.idle.set()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        poller = asyncio.create_task(metrics.poll(llm))
        try:
            yield
        finally:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)

    app = FastAPI(
        title="deltaserve",
        version=package_version(),
        lifespan=lifespan,
        # No interactive docs: they pull JavaScript from a CDN and are one more surface to audit.
        docs_url=None,
        redoc_url=None,
        # Starlette builds slash redirects from the client's Host header (an open redirect): a path
        # with a stray slash is a 404 instead.
        redirect_slashes=False,
    )
    app.state.ds = state
    install_error_handlers(app)
    app.include_router(completions_router)
    app.include_router(chat_router)
    app.include_router(misc_router)
    # Middlewares wrap outside-in in reverse order of addition: auth runs first, so an unauthenticated
    # client learns nothing (not even the size limit); then draining; then the body limit. Framing
    # checks come before auth (a smuggled request must not reach anything), the access log outermost
    # so that every answer, 401 and 431 included, leaves a line.
    # CORS is deliberately absent: browsers get the same-origin default.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_request_bytes)
    app.add_middleware(DrainMiddleware, state=state)
    app.add_middleware(APIKeyMiddleware, api_key=config.api_key)
    app.add_middleware(FramingMiddleware)
    app.add_middleware(AccessLogMiddleware)
    return app


def _ready_info(llm: Any) -> Any:
    """The engine's ReadyInfo (None for a client that has none, like the tests' fakes)."""
    return getattr(getattr(llm, "client", None), "ready_info", None)


def _device_name(llm: Any) -> str:
    name = getattr(llm, "device_name", None)
    if name is None:
        name = getattr(_ready_info(llm), "device_name", None)
    return str(name or "unknown")


def _memory_split(llm: Any) -> dict[str, int]:
    split = getattr(_ready_info(llm), "memory", None)
    return dict(split) if isinstance(split, dict) else {}
