"""Issue 13, the non-streaming hang-up leak: a cancellation that lands in the same loop turn as an
output must still cancel. ``asyncio.wait_for`` on Python 3.11 returned the output and swallowed the
cancellation, so a disconnected request kept generating to max_tokens with its blocks and slot.

The first test pins the race deterministically; the second hangs up 6 x 60 non-streaming clients at
staggered moments against the real server and asserts the pools are empty after every round."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from server.streaming import MergedOutputs
from tests.server.realserver import Server

ROUNDS, CLIENTS = 6, 60


async def _source(q: asyncio.Queue[object]) -> AsyncIterator[object]:
    while True:
        yield await q.get()


@pytest.mark.asyncio
@pytest.mark.parametrize("timeout", [None, 30.0])
async def test_cancel_in_the_same_turn_as_an_output_cancels(timeout: float | None) -> None:
    feed: asyncio.Queue[object] = asyncio.Queue()
    merged = MergedOutputs([_source(feed)])  # type: ignore[list-item]
    seen = 0

    async def consumer() -> None:
        nonlocal seen
        while await merged.next(timeout) is not None:
            seen += 1

    task = asyncio.create_task(consumer())
    for _ in range(5):
        await asyncio.sleep(0)  # the consumer now waits inside next()
    # The output and the cancellation arrive together, as when a client hangs up mid-step.
    merged._queue.put_nowait((0, SimpleNamespace(finished=False)))  # type: ignore[arg-type]
    task.cancel()
    for _ in range(20):
        await asyncio.sleep(0)
    assert task.done(), "the consumer ignored its cancellation and kept reading"
    assert task.cancelled()
    await merged.aclose()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("hangup"),
        *("--max-num-seqs", "8", "--max-waiting-requests", "128", "--num-gpu-blocks-override", "200"),
    )
    yield srv
    srv.stop()


@pytest.mark.slow
def test_staggered_non_streaming_hangups_free_everything(server: Server) -> None:
    rng = np.random.default_rng(13)
    body = {"prompt": "Hang up on me", "max_tokens": 400, "ignore_eos": True}

    async def one_round(delays: np.ndarray) -> None:
        limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as http:
            tasks = [asyncio.create_task(http.post("/v1/completions", json=body)) for _ in delays]
            start = asyncio.get_running_loop().time()
            for delay, task in sorted(zip(delays, tasks, strict=True), key=lambda p: p[0]):
                await asyncio.sleep(max(0.0, start + float(delay) - asyncio.get_running_loop().time()))
                task.cancel()  # closes that client's connection: a hang-up
            await asyncio.gather(*tasks, return_exceptions=True)

    for _ in range(ROUNDS):
        asyncio.run(one_round(rng.uniform(0.05, 1.5, size=CLIENTS)))
        # Every hung-up request is aborted at once: nothing keeps generating to max_tokens.
        server.wait_pools_empty(timeout_s=3.0)
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
