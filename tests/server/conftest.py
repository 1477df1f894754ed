"""Fixtures: the real in-process AsyncLLM on the embedded tiny model, and apps built over it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio

from engine.config import EngineConfig, ModelConfig, ServerConfig
from engine.worker.resolve import resolve_model
from server.app import build_app

API_KEY = "test-key-0123456789"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def llm() -> AsyncIterator[Any]:
    from engine.frontend.async_llm import AsyncLLM

    cfg = EngineConfig(model=resolve_model(ModelConfig()))
    engine = await AsyncLLM.create(cfg, ServerConfig(), in_process=True)
    try:
        yield engine
    finally:
        await engine.shutdown()


async def _client(llm: Any, config: ServerConfig) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(llm, config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client(llm: Any) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(llm, ServerConfig(max_request_bytes=256 * 1024)):
        yield c


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def auth_client(llm: Any) -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(llm, ServerConfig(api_key=API_KEY)):
        yield c


def assert_openai_error(resp: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error shape, with nothing of FastAPI's default 422 body."""
    assert resp.status_code == status, (resp.status_code, resp.text[:500])
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and 0 < len(err["message"]) < 600
    assert "detail" not in resp.text and "Traceback" not in resp.text and "/work/" not in resp.text
    if param is not None:
        assert err["param"] == param or param in err["message"], err
    return err
