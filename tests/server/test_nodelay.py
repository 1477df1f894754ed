"""Served connections have Nagle's algorithm off. A response's head and body are two writes; with Nagle
on, the body waited for the client's delayed ACK, 40 ms on every request (W2's TTFT doubled)."""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from server.http_limits import guarded_protocol
from server.listen import bind_socket


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_listening_socket_is_tcp_so_asyncio_sets_nodelay():
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


async def test_accepted_connections_have_nodelay():
    proto = guarded_protocol(30.0, 16)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(_app, http=proto, log_config=None, access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and await reader.readexactly(2) == b"ok"
        served = list(server.server_state.connections)
        assert served, "no served connection to inspect"
        for c in served:
            s = c.transport.get_extra_info("socket")
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        writer.close()
    finally:
        server.should_exit = True
        await task
