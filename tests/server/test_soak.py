"""RELIABILITY 19: a bounded soak of the real server (tiny model, ZeroMQ engine process): mixed
streaming and non-streaming traffic with ~1% malformed requests and ~10% clients that leave
mid-stream, for ~15 s. No unexpected 5xx, pools and queue empty at the end, memory flat."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import httpx
import pytest

from tests.loadgen.test_e2e_server import server  # noqa: F401  (the real-server fixture)
from tests.procs import children, cmdline, rss_bytes

pytestmark = pytest.mark.slow
DURATION_S = 15.0
WORKERS = 12


def _rss_bytes(port: int) -> int:
    """Resident memory of the server process (found by its --port) and its children."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            cmd = cmdline(int(entry.name))
            if "engine.cli serve" in cmd and f"--port {port}" in cmd:
                pid = int(entry.name)
                return rss_bytes([pid, *children(pid)])
    raise AssertionError("server process not found")


async def _traffic(url: str, until: float, seed: int, statuses: list[int]) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=60) as http:
        while time.monotonic() < until:
            roll = rng.random()
            if roll < 0.01:
                r = await http.post(
                    f"{url}/v1/completions",
                    content=b'{"prompt": [1, 2',
                    headers={"Content-Type": "application/json"},
                )
                assert r.status_code == 400, r.text
                statuses.append(r.status_code)
                continue
            body = {
                "prompt": f"soak {rng.randrange(10**6)}",
                "max_tokens": rng.randint(1, 24),
                "temperature": rng.choice([0.0, 0.8]),
            }
            if roll < 0.6:
                async with http.stream(
                    "POST", f"{url}/v1/completions", json={**body, "stream": True}
                ) as resp:
                    statuses.append(resp.status_code)
                    leave = rng.random() < 0.17  # ~10% of all requests leave mid-stream
                    async for line in resp.aiter_lines():
                        if leave and line.startswith("data: {"):
                            break
            else:
                r = await http.post(f"{url}/v1/completions", json=body)
                statuses.append(r.status_code)


async def _metrics(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{url}/metrics")).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def test_soak_mixed_traffic(server: str) -> None:  # noqa: F811
    port = int(server.rsplit(":", 1)[1])

    async def run(seconds: float, seed: int) -> list[int]:
        statuses: list[int] = []
        until = time.monotonic() + seconds
        await asyncio.gather(*(_traffic(server, until, seed * 100 + w, statuses) for w in range(WORKERS)))
        return statuses

    asyncio.run(run(4.0, 1))  # warm-up: first-use allocations are not growth
    before = _rss_bytes(port)
    statuses = asyncio.run(run(DURATION_S, 2))
    after = _rss_bytes(port)
    assert statuses and all(s in (200, 400) for s in statuses), sorted(set(statuses))
    assert len(statuses) > 100, "the soak sent too little traffic to mean anything"

    async def drained() -> dict[str, float]:
        for _ in range(50):
            m = await _metrics(server)
            if m["deltaserve_kv_blocks_used"] == 0 and m["deltaserve_state_slots_used"] == 0:
                return m
            await asyncio.sleep(0.1)
        return m

    m = asyncio.run(drained())
    assert (m["deltaserve_kv_blocks_used"], m["deltaserve_state_slots_used"]) == (0, 0), m
    assert m["deltaserve_num_requests_waiting"] == 0 and m["deltaserve_num_requests_running"] == 0
    print(f"soak: {len(statuses)} requests, rss {before / 2**20:.0f} -> {after / 2**20:.0f} MiB")
    assert after - before < 64 * 2**20, (
        f"server memory grew by {(after - before) / 2**20:.1f} MiB in {DURATION_S} s"
    )
