"""Issue 13: slow or stalled clients cannot hold the server. A trickling or never-arriving body is cut
off with 408 after the body deadline; thousands of stalled connections cannot lock legitimate
clients out (the oldest stalled one is shed to make room); a stalled client does not delay SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.realserver import RawConn, Server

pytestmark = pytest.mark.slow
STALLED = 2100  # above the default cap of 2048 open connections
HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n"
)


def _addr(server: Server) -> tuple[str, int]:
    return "127.0.0.1", server.port


def test_trickling_and_missing_bodies_get_408(tmp_path: Path) -> None:
    server = Server(tmp_path, "--body-read-timeout-s", "2")
    try:
        with RawConn(server.url, timeout_s=10) as conn:  # the body never comes
            conn.send(HEAD)
            t0 = time.monotonic()
            resp = conn.read_response()
            assert resp is not None and resp.status == 408, resp and resp.status
            assert time.monotonic() - t0 < 4
            assert resp.headers.get("connection") == "close" and conn.closed_by_peer()
        with RawConn(server.url, timeout_s=10) as conn:  # one byte every half second
            conn.send(HEAD)
            t0 = time.monotonic()
            answered = None
            for _ in range(20):
                try:
                    conn.send(b" ")
                except OSError:
                    break
                conn.sock.settimeout(0.5)
                try:
                    answered = conn.read_response()
                    break
                except TimeoutError:
                    continue
            assert answered is not None and answered.status == 408
            assert time.monotonic() - t0 < 4, "a trickle kept extending the deadline"
        # A body that arrives in pieces but in time is served.
        body = b'{"prompt": "ok", "max_tokens": 2}'
        with RawConn(server.url) as conn:
            conn.send(HEAD.replace(b"100", str(len(body)).encode()) + body[:10])
            time.sleep(0.5)
            conn.send(body[10:])
            resp = conn.read_response()
            assert resp is not None and resp.status == 200
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("slow"))
    yield srv
    srv.stop()


def _stall(server: Server, n: int) -> list[socket.socket]:
    """n connections that each sent a request head and never send the body (or half a head)."""
    socks = []
    for i in range(n):
        s = socket.create_connection(_addr(server), timeout=10)
        s.sendall(HEAD if i % 2 else HEAD[:40])
        socks.append(s)
    return socks


def test_stalled_connections_do_not_starve_legitimate_requests(server: Server) -> None:
    stalled = _stall(server, STALLED)
    try:

        async def legit() -> list[int]:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                body = {"prompt": "I am legitimate", "max_tokens": 2}
                rs = await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(40)))
                return [r.status_code for r in rs]

        statuses = asyncio.run(legit())
        assert statuses == [200] * 40, statuses
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
    finally:
        for s in stalled:
            s.close()


def test_sigterm_not_delayed_by_a_stalled_client(server: Server) -> None:
    stalled = _stall(server, 4)
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=20) == 0
        assert time.monotonic() - t0 < 10, "the drain waited for a client that never sent its body"
    finally:
        for s in stalled:
            s.close()
