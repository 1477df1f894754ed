"""DeltaClient against the app on the real in-process engine (ASGI transport, no sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from client import APIError, DeltaClient
from engine.config import EngineConfig, ModelConfig, ServerConfig
from engine.worker.resolve import resolve_model
from server.app import build_app

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client() -> AsyncIterator[DeltaClient]:
    from engine.frontend.async_llm import AsyncLLM

    llm = await AsyncLLM.create(
        EngineConfig(model=resolve_model(ModelConfig())), ServerConfig(), in_process=True
    )
    app = build_app(llm, ServerConfig(api_key="k"))
    try:
        async with app.router.lifespan_context(app):
            async with DeltaClient("http://t", api_key="k", transport=httpx.ASGITransport(app=app)) as c:
                yield c
    finally:
        await llm.shutdown()


async def test_complete_and_stream_agree(client: DeltaClient) -> None:
    whole = await client.complete("Hello", max_tokens=8, temperature=0, ignore_eos=True)
    assert whole.choices[0].finish_reason == "length" and whole.usage and whole.usage.completion_tokens == 8
    chunks = [c async for c in client.stream_complete("Hello", max_tokens=8, temperature=0, ignore_eos=True)]
    assert "".join(ch.text for c in chunks for ch in c.choices) == whole.text


async def test_chat_and_stream_chat(client: DeltaClient) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    whole = await client.chat(msgs, max_tokens=6, temperature=0, ignore_eos=True)
    assert whole.choices[0].role == "assistant"
    chunks = [c async for c in client.stream_chat(msgs, max_tokens=6, temperature=0, ignore_eos=True)]
    assert chunks[0].choices[0].role == "assistant"
    assert "".join(ch.text for c in chunks for ch in c.choices) == whole.content


async def test_usage_chunk(client: DeltaClient) -> None:
    chunks = [
        c
        async for c in client.stream_complete(
            "x", max_tokens=3, ignore_eos=True, stream_options={"include_usage": True}
        )
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage and chunks[-1].usage.completion_tokens == 3


async def test_typed_errors(client: DeltaClient) -> None:
    with pytest.raises(APIError) as exc:
        await client.complete("x", max_tokens=1, n=99)
    assert exc.value.status == 400 and exc.value.type == "invalid_request_error" and exc.value.param == "n"
    with pytest.raises(APIError) as exc:
        await client.complete("x", model="nope")
    assert exc.value.status == 404 and exc.value.code == "model_not_found"
    with pytest.raises(APIError) as exc:
        async for _ in client.stream_complete("", max_tokens=1):
            pass
    assert exc.value.status == 400


async def test_utilities(client: DeltaClient) -> None:
    assert len(await client.models()) == 1
    ids = await client.tokenize("round trip")
    assert await client.detokenize(ids) == "round trip"
    assert await client.health()
