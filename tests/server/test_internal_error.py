"""A 500 (a bug, never bad input) is still the OpenAI error shape and says ``Connection: close``:
Starlette re-raises after answering and uvicorn drops the connection, so the client must know not to
wait for answers to requests it pipelined behind."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.conftest import assert_openai_error

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_internal_error_closes_connection(client: httpx.AsyncClient, llm: Any) -> None:
    tok = llm.tokenizer
    original = tok.encode

    def broken(*args: Any, **kwargs: Any) -> list[int]:
        raise RuntimeError("a bug in the tokenizer")

    # Starlette re-raises after answering; keep the answer instead of the exception here.
    transport = httpx.ASGITransport(app=client.app, raise_app_exceptions=False)  # type: ignore[attr-defined]
    tok.encode = broken
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            resp = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
    finally:
        tok.encode = original
    err = assert_openai_error(resp, 500)
    assert err["code"] == "internal_error" and "tokenizer" not in err["message"]
    assert resp.headers["connection"] == "close"
