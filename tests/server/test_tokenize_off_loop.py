"""Issue 13: a 4 MB batch of 256 prompts is tokenized off the event loop. Before, only a single prompt
over 16,384 characters moved to a thread, so such a batch held every other request (/health
included) for seconds; now the loop keeps turning while it is tokenized."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from engine.config import EngineConfig, ModelConfig, ServerConfig
from engine.frontend.async_llm import AsyncLLM
from engine.worker.resolve import resolve_model
from server.app import build_app


def _prompts(n: int, chars: int) -> list[str]:
    rng = np.random.default_rng(7)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "kappa", "lambda"]
    out = []
    for _ in range(n):
        picks = rng.integers(0, len(words), size=chars // 5)
        out.append(" ".join(words[i] for i in picks)[:chars])
    return out


@pytest.mark.asyncio
async def test_big_batch_tokenized_off_the_loop() -> None:
    cfg = EngineConfig(model=resolve_model(ModelConfig()))
    llm = await AsyncLLM.create(cfg, ServerConfig(), in_process=True)
    app = build_app(llm, ServerConfig())
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=120) as http:
                body = {"prompt": _prompts(256, 16_000), "max_tokens": 1}
                worst = 0.0
                done = asyncio.Event()

                async def ticker() -> None:
                    nonlocal worst
                    while not done.is_set():
                        t0 = time.monotonic()
                        await asyncio.sleep(0.01)
                        worst = max(worst, time.monotonic() - t0)

                tick = asyncio.create_task(ticker())
                await asyncio.sleep(0.05)
                t0 = time.monotonic()
                resp = await http.post("/v1/completions", json=body)
                took = time.monotonic() - t0
                done.set()
                await tick
                # Each prompt is longer than the tiny model's context: a 400, after tokenizing all.
                assert resp.status_code == 400 and "context" in resp.text, resp.text[:300]
                assert took > 0.5, "tokenizing 4 MB was too quick to tell anything"
                assert worst < 0.5, f"the event loop stalled {worst:.2f} s during a {took:.2f} s request"
    finally:
        await llm.shutdown()
