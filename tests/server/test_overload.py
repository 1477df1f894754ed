"""RELIABILITY 10 over HTTP: a full queue answers 503 with Retry-After at once, a list prompt is
admitted all-or-nothing, and the server recovers fully when load drops."""

from __future__ import annotations

import asyncio

import httpx

from engine.config import EngineConfig, ModelConfig, SchedulerConfig, ServerConfig
from engine.frontend.async_llm import AsyncLLM
from engine.worker.resolve import resolve_model
from server.app import build_app
from tests.server.conftest import assert_openai_error


async def test_queue_full_503_retry_after_all_or_nothing_and_recovery():
    # Room for 2 running + 2 waiting requests.
    cfg = EngineConfig(
        model=resolve_model(ModelConfig()), scheduler=SchedulerConfig(max_num_seqs=2, max_waiting_requests=2)
    )
    llm = await AsyncLLM.create(cfg, ServerConfig(), in_process=True)
    app = build_app(llm, ServerConfig())
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as http:
                five = {"prompt": ["a", "b", "c", "d", "e"], "max_tokens": 2}
                # Five can never fit in 2 + 2, even idle: 400 saying why, not a 503 to retry forever.
                r = await http.post("/v1/completions", json=five)
                err = assert_openai_error(r, 400)
                assert "Retry-After" not in r.headers and "at most 4" in err["message"]
                assert llm.num_unfinished == 0  # nothing of the list was admitted

                long = {"prompt": "busy", "max_tokens": 400, "ignore_eos": True}
                busy = [asyncio.create_task(http.post("/v1/completions", json=long)) for _ in range(4)]
                for _ in range(200):
                    if llm.num_unfinished == 4:
                        break
                    await asyncio.sleep(0.01)
                assert llm.num_unfinished == 4
                r = await http.post("/v1/completions", json={"prompt": "one more", "max_tokens": 2})
                assert_openai_error(r, 503)
                assert int(r.headers["Retry-After"]) >= 1
                r = await http.post("/v1/completions", json={**five, "prompt": ["a", "b"]})
                assert_openai_error(r, 503)  # would fit an idle server: retry later is right
                assert llm.num_unfinished == 4  # and none of it was admitted
                assert all(r.status_code == 200 for r in await asyncio.gather(*busy))

                r = await http.post("/v1/completions", json={**five, "prompt": ["a", "b", "c", "d"]})
                assert r.status_code == 200 and len(r.json()["choices"]) == 4  # recovered
    finally:
        await llm.shutdown()
