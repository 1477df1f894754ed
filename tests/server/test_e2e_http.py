"""The real server over real HTTP: `python -m engine.cli serve` in a subprocess with its ZeroMQ
EngineCore process, driven by the official `openai` SDK and raw httpx.

The engine-kill test runs last on purpose: it ends the module's server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import engine_children
from tests.server.realserver import Server

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
WAVE = 32


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen]]:
    srv = Server(tmp_path_factory.mktemp("server"), "--admission-window-ms", "200")
    yield srv.url, srv.proc
    srv.stop()


def _oai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


async def _metrics(url: str) -> dict[str, float]:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    return {
        s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels
    }


async def _pools_empty(url: str, when: str, timeout_s: float = 5.0) -> dict[str, float]:
    """The metrics once no KV block and no state slot is in use (asserted within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = await _metrics(url)
        if m["deltaserve_kv_blocks_used"] == 0 and m["deltaserve_state_slots_used"] == 0:
            return m
        assert time.monotonic() < deadline, f"pools not empty {timeout_s:.0f} s {when}: {m}"
        await asyncio.sleep(0.1)


async def test_openai_sdk_completions_chat_streaming(server: tuple[str, subprocess.Popen]) -> None:
    url, _ = server
    client = _oai(url)
    model = (await client.models.list()).data[0].id
    comp = await client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=0)
    assert comp.choices[0].finish_reason in ("stop", "length") and comp.usage is not None
    stream = await client.completions.create(
        model=model,
        prompt="Hello",
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    async for chunk in stream:
        pieces += [c.text for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(pieces) == comp.choices[0].text and usage == comp.usage
    msgs = [{"role": "user", "content": "Hi there"}]
    chat = await client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    stream = await client.chat.completions.create(
        model=model, messages=msgs, max_tokens=8, temperature=0, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(model=model, prompt="x", max_tokens=1, n=100)
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="nope", prompt="x", max_tokens=1)
    await client.close()


async def test_wave_of_32_scheduled_together(server: tuple[str, subprocess.Popen]) -> None:
    url, _ = server
    client = _oai(url)
    model = (await client.models.list()).data[0].id
    prompts = [f"Request number {i} says" for i in range(WAVE)]

    async def one(p: str) -> str:
        r = await client.completions.create(model=model, prompt=p, max_tokens=8, temperature=0)
        return r.choices[0].text

    alone = [await one(p) for p in prompts]
    before = (await _metrics(url)).get("deltaserve_max_wave_admitted", 0)
    assert before < WAVE  # sequential requests never formed a wave this large
    together = await asyncio.gather(*(one(p) for p in prompts))
    assert together == alone
    after = await _metrics(url)
    assert after["deltaserve_max_wave_admitted"] >= WAVE, after
    await client.close()


async def test_disconnect_mid_stream_frees_blocks_and_slot(server: tuple[str, subprocess.Popen]) -> None:
    url, _ = server
    body = {"prompt": "Tell me a very long story", "ignore_eos": True, "stream": True}
    for _ in range(3):
        async with httpx.AsyncClient(timeout=60) as http:
            async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                seen = 0
                async for line in resp.aiter_lines():
                    seen += line.startswith("data: {")
                    if seen >= 3:
                        break
            # Leaving both blocks closes the connection mid-stream.
    m = await _pools_empty(url, "after disconnect")
    assert m["deltaserve_num_requests_running"] == 0


async def test_disconnect_storm_frees_everything(server: tuple[str, subprocess.Popen]) -> None:
    """RELIABILITY 7: 50 clients leave mid-stream and 50 leave while queued (non-streaming); the pools
    are empty again within seconds and a concurrent greedy request gets its idle-server tokens."""
    url, _ = server
    body = {"prompt": "Storm", "max_tokens": 300, "ignore_eos": True, "stream": True}
    greedy = {"prompt": "A quiet request", "max_tokens": 12, "temperature": 0}
    async with httpx.AsyncClient(timeout=60) as http:
        idle = (await http.post(f"{url}/v1/completions", json=greedy)).json()["choices"][0]["text"]

    async def leave_mid_stream(http: httpx.AsyncClient) -> None:
        async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    return  # closes the connection after the first token

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        streams = [asyncio.create_task(leave_mid_stream(http)) for _ in range(50)]
        queued = [
            asyncio.create_task(http.post(f"{url}/v1/completions", json={**body, "stream": False}))
            for _ in range(50)
        ]
        concurrent = asyncio.create_task(http.post(f"{url}/v1/completions", json=greedy))
        await asyncio.sleep(0.5)
        for t in queued:
            t.cancel()
        await asyncio.gather(*streams)
        text = (await concurrent).json()["choices"][0]["text"]
    assert text == idle
    m = await _pools_empty(url, "after the storm")
    assert m["deltaserve_num_requests_running"] == 0 and m["deltaserve_num_requests_waiting"] == 0
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"{url}/health")).status_code == 200


async def test_engine_killed_ready_503_and_requests_fail(server: tuple[str, subprocess.Popen]) -> None:
    url, proc = server
    engines = engine_children(proc.pid)
    assert engines, "no EngineCore child process found"
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.get(f"{url}/ready")).status_code == 200
        long = {"prompt": "Keep going", "ignore_eos": True}  # no max_tokens: the whole context

        async def streaming() -> str:
            async with http.stream("POST", f"{url}/v1/completions", json={**long, "stream": True}) as resp:
                frames = [line async for line in resp.aiter_lines() if line.startswith("data: ")]
            assert frames[-1] == "data: [DONE]", frames[-3:]
            return frames[-2]

        async def whole() -> int:
            return (await http.post(f"{url}/v1/completions", json=long)).status_code

        tasks = [asyncio.create_task(streaming()), asyncio.create_task(whole())]
        await asyncio.sleep(0.5)
        for pid in engines:
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        while (await http.get(f"{url}/ready")).status_code != 503:
            assert time.monotonic() - t0 < 5, "/ready still 200 five seconds after the engine died"
            await asyncio.sleep(0.1)
        last_frame, status = await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        assert "error" in json.loads(last_frame[len("data: ") :])
        assert status >= 500
    # Then the API process exits non-zero so that a supervisor restarts it (no dead server left up).
    assert await asyncio.to_thread(proc.wait, 15) == 1
