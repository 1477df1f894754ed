"""HTTP/1.1 limits below the app: deadlines on the request head and body, a connection cap that sheds
stalled connections instead of legitimate ones, the request-head size limit, and framing that could
be read two ways (Content-Length with Transfer-Encoding, RFC 9112 6.1: reject and close).

uvicorn only times out idle keep-alive connections and answers 503 to every new request once its
connection count is reached, so one client holding thousands of trickling connections would lock
everyone else out; here the oldest connection that has not finished sending its request is closed to
make room instead.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any, ClassVar

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.errors import APIError, send_error

HEADER_TIMEOUT_S = 10.0
"""A client must deliver a complete request head within this long (slow-loris guard)."""
MAX_HEADER_BYTES = 64 * 1024
"""Largest request head (request line plus headers); beyond it the answer is 431 and a close."""
H11_BACKSTOP_BYTES = 4 * MAX_HEADER_BYTES
"""h11's own incomplete-event limit: only a backstop, set above ours so that ours answers first."""


def _raw_error(status: int, reason: str, message: str) -> bytes:
    """A complete error response for a connection whose request h11 never parsed (no ASGI cycle)."""
    body = json.dumps(APIError(status, message).body()).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with head/body deadlines, a 64 KiB head limit and stall shedding.

    Subclassed per server by :func:`guarded_protocol` to carry the limits as class attributes (uvicorn
    instantiates the protocol class itself).
    """

    body_timeout_s: ClassVar[float] = 30.0
    max_connections: ClassVar[int] = 2048

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # whatever made the listening socket: a response's head and body are two writes, and with
            # Nagle on the second waits for the client's delayed ACK (40 ms)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._since = time.monotonic()
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()
        if len(self.connections) > self.max_connections:
            self._shed_one()

    # ---- deadlines ---------------------------------------------------------------------------------
    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._head_timeout)

    def _disarm(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            pending = len(self.conn.trailing_data[0])
            if pending > MAX_HEADER_BYTES:
                self._reject_raw(431, "Request Header Fields Too Large", "Request head exceeds 64 KiB")
            elif pending:
                self._arm_head_timer()  # part of a head is buffered: the clock runs until it completes
        elif state is h11.SEND_BODY:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            if self._body_timer is None:
                self._since = time.monotonic()
                self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timeout)
        else:
            self._disarm()

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def _body_timeout(self) -> None:
        self._body_timer = None
        if self.conn.their_state is h11.SEND_BODY:
            self.cut(f"Request body not received within {self.body_timeout_s:g} s")

    # ---- cutting a connection off ------------------------------------------------------------------
    def _reject_raw(self, status: int, reason: str, message: str) -> None:
        self._disarm()
        self.transport.write(_raw_error(status, reason, message))
        self.transport.close()

    def unadmitted(self) -> bool:
        """Still sending its request (head or body), or idle between requests: safe to close."""
        if self.transport.is_closing():
            return False
        state = self.conn.their_state
        if state is h11.IDLE:
            return self.cycle is None or self.cycle.response_complete
        return state is h11.SEND_BODY and self.cycle is not None and not self.cycle.response_started

    def cut(self, message: str = "Request body not received in time") -> None:
        """Close an unadmitted connection: 408 if a request is half received, else just close. The
        app's task, if any, sees a disconnect on its next receive() and its sends are dropped."""
        if self.conn.their_state is h11.SEND_BODY and self.cycle is not None:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            self._reject_raw(408, "Request Timeout", message)
        else:
            self._disarm()
            self.transport.close()

    def _shed_one(self) -> None:
        # The oldest stalled connection makes room; a fresh one is never the victim while others wait.
        victims = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol)]
        victims = [c for c in victims if c.unadmitted()]
        if victims:
            min(victims, key=lambda c: c._since).cut("Connection closed to make room (request too slow)")

    def on_response_complete(self) -> None:
        self._since = time.monotonic()
        super().on_response_complete()

    def shutdown(self) -> None:
        # A client that never finishes its request must not hold up the graceful shutdown.
        if self.unadmitted():
            self.cut("Server is shutting down")
        else:
            super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def guarded_protocol(body_timeout_s: float, max_connections: int) -> type[GuardedH11Protocol]:
    return type(
        "ServerH11Protocol",
        (GuardedH11Protocol,),
        {"body_timeout_s": body_timeout_s, "max_connections": max_connections},
    )


def cut_unadmitted(connections: Any) -> int:
    """Close every connection still sending its request (SIGTERM: they would only delay the drain)."""
    cut = 0
    for conn in list(connections):
        if isinstance(conn, GuardedH11Protocol) and conn.unadmitted():
            conn.cut("Server is shutting down")
            cut += 1
    return cut


class FramingMiddleware:
    """Outermost ASGI check of the parsed head: head size (431) and CL+TE smuggling (400), both closing
    the connection. A head that arrived in one read is complete before the protocol could count it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        size = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) + 16
        size += sum(len(k) + len(v) + 4 for k, v in headers)
        if size > MAX_HEADER_BYTES:
            await send_error(send, APIError(431, "Request head exceeds 64 KiB"), close=True)
            return
        names = {k for k, _ in headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            err = APIError(400, "Content-Length together with Transfer-Encoding is not allowed")
            await send_error(send, err, close=True)
            return
        await self.app(scope, receive, send)
