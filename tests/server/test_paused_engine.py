"""Issue 13: a paused engine (SIGSTOP, as a stuck GPU or a debugger would) under traffic must not
freeze the API process. Requests arrive and are abandoned faster than anyone reads the engine's
socket; before the fix the event loop blocked in a ZeroMQ send after about a thousand queued
messages and /health stopped answering. Now the backlog is bounded, new requests get 503, /health
answers throughout, and after SIGCONT the engine catches up and the pools empty."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.procs import engine_children
from tests.server.realserver import Server

pytestmark = pytest.mark.slow
PROMPT = " ".join(f"word{i}" for i in range(400))  # big waves fill the socket buffers sooner


@pytest.fixture()
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("paused"),
        *("--max-num-seqs", "4", "--max-waiting-requests", "4096", "--num-gpu-blocks-override", "400"),
        *("--engine-stall-timeout-s", "3"),
    )
    yield srv
    srv.stop()


def test_paused_engine_under_traffic_health_answers(server: Server) -> None:
    (engine,) = engine_children(server.proc.pid)
    greedy = {"prompt": "Hello there", "max_tokens": 8, "temperature": 0}
    idle = httpx.post(f"{server.url}/v1/completions", json=greedy, timeout=60).json()["choices"][0]["text"]
    os.kill(engine, signal.SIGSTOP)
    health: list[tuple[float, bool]] = []
    statuses: dict[int | str, int] = {}
    stop = threading.Event()

    def probe() -> None:
        # Its own thread and connection pool: the traffic below must not slow the measurement itself.
        with httpx.Client(base_url=server.url, timeout=3.0) as http:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    ok = http.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                health.append((time.monotonic() - t0, ok))
                time.sleep(0.05)

    try:

        async def abandon(http: httpx.AsyncClient) -> None:
            body = {"prompt": PROMPT, "max_tokens": 16}
            try:
                r = await http.post("/v1/completions", json=body, timeout=0.15)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            except httpx.HTTPError:
                statuses["hung up"] = statuses.get("hung up", 0) + 1

        async def traffic() -> None:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=server.url, limits=limits) as http:
                deadline = time.monotonic() + 40
                while time.monotonic() < deadline and statuses.get(503, 0) < 200:
                    await asyncio.gather(*(abandon(http) for _ in range(64)))

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        asyncio.run(traffic())
        ready = httpx.get(f"{server.url}/ready", timeout=5).status_code
    finally:
        stop.set()
        os.kill(engine, signal.SIGCONT)
    worst = max(t for t, _ in health)
    failures = sum(not ok for _, ok in health)
    assert failures == 0 and worst < 3.0, (failures, worst, len(health), statuses)
    assert statuses.get(503, 0) > 0, f"the backlog never filled, the test proved nothing: {statuses}"
    assert ready == 503  # stalled: not ready, though alive
    server.wait_pools_empty(timeout_s=60)
    after = httpx.post(f"{server.url}/v1/completions", json=greedy, timeout=60)
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == idle
    assert httpx.get(f"{server.url}/ready", timeout=5).status_code == 200
